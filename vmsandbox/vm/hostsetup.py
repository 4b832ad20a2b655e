"""What a package's install scripts, a service manager and udev would do on a normal host: the unprivileged
account for guest data, /dev/kvm permissions and libvirt's daemons."""

from __future__ import annotations

import grp
import os
import pwd
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from vmsandbox import filewrite, packages, paths, proc
from vmsandbox.confine import access, accounts, pool
from vmsandbox.errors import VmsandboxError
from vmsandbox.vm.accel import KVM_DEVICE
from vmsandbox.vm.virt import Hypervisor

ACCOUNT_COMMENT = "vmsandbox, reads what comes out of guests"  # GECOS: no colon, no newline
SERVICE_MANAGER = Path("/run/systemd/system")  # present when systemd runs the host
SYSTEM_CONF = Path("/etc/libvirt/libvirtd.conf")
RUNTIME_CONF = Path("/run/vmsandbox/libvirtd.conf")  # what `host setup` starts libvirtd with
GROUP_ACCESS = (("unix_sock_group", access.GROUP), ("unix_sock_rw_perms", "0770"), ("auth_unix_rw", "none"))
DAEMONS = {"virtlogd": Path("/run/libvirt/virtlogd-sock"), "libvirtd": Path("/run/libvirt/libvirt-sock")}
# Where no service manager runs, libvirtd runs as the child of a reaper (tini, a subreaper): its QEMUs, orphans by
# design, are then reaped the moment they exit. PID 1 there (a container's or a sandbox's init) may take seconds,
# and libvirt waits for that, in steps of 200 ms, at every VM stop: a save, a destroy (measured: 1.4-2.0 s each).
REAPER = "tini"
LIBVIRTD_LOG = Path("/run/vmsandbox/libvirtd.log")  # libvirtd's own output, run so (not daemonized)


def kvm_permissions_ok(device: Path = KVM_DEVICE) -> bool:
    """As udev sets it: group kvm, mode 0660. Otherwise libvirt re-probes QEMU on every create (~60 s)."""
    try:
        st = device.stat()
        kvm_gid = grp.getgrnam("kvm").gr_gid
    except (OSError, KeyError):
        return True  # no device or no group: nothing to fix
    return st.st_gid == kvm_gid and stat.S_IMODE(st.st_mode) & 0o660 == 0o660


def _pids(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _daemon_running(name: str) -> bool:
    return bool(_pids(name))


def setup(uri: str, user: str | None = None) -> Iterator[str]:
    """Bring the host to the state a session needs; yields a line per action taken. `user` (by default the
    one who ran sudo) joins the libvirt group, so that they need no sudo from then on."""
    if os.geteuid() != 0:
        raise VmsandboxError("host set-up needs root", hint="run `sudo vmsandbox host setup`")
    if accounts.account() is None:
        proc.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--comment",
                ACCOUNT_COMMENT,
                accounts.ACCOUNT,
            ]
        )
        yield f"created the unprivileged account {accounts.ACCOUNT} (it owns and reads guest data on the host)"
    made, new = pool.make()
    if new:
        last = made.first + made.count - 1
        yield f"reserved {made.count} ids ({made.first}-{last}) for the accounts of sessions' QEMUs, one each"
    if access.group_gid() is None:
        proc.run(["groupadd", "--system", access.GROUP])
        yield f"created the group {access.GROUP} (its members use libvirt, and vmsandbox, without sudo)"
    if KVM_DEVICE.exists() and not kvm_permissions_ok():
        os.chown(KVM_DEVICE, -1, grp.getgrnam("kvm").gr_gid)
        KVM_DEVICE.chmod(0o660)
        yield f"set {KVM_DEVICE} to group kvm, mode 0660 (as udev would)"
    yield from _daemons()
    images = paths.images_dir()
    access.store_root(images)
    yield f"{images} is shared with the group {access.GROUP} (mode 2775: members add blueprint layers and templates)"
    given = reclaim_images(images)
    if given:
        yield f"{given} image file(s) libvirt had given to QEMU's account are root's again (read-only, shared)"
    if user:
        yield from _join(user)
    deadline = time.monotonic() + 60  # libvirtd's first start probes QEMU for ~15 s
    while True:
        try:
            with Hypervisor(uri) as hv:
                yield f"libvirt {hv.version()} answers at {uri}"
                return
        except VmsandboxError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def reclaim_images(images: Path) -> int:
    """The image files libvirt gave QEMU's account while sessions probed their chains (before each session named
    them, never to be labelled): root's again, so that no QEMU can make them writable. How many."""
    qemu = accounts.qemu_uid()
    if qemu is None or not images.is_dir():
        return 0
    given = 0
    for _dirpath, _dirs, files, dir_fd in os.fwalk(images, follow_symlinks=False):
        for name in files:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == qemu and not st.st_mode & 0o222:
                os.chown(name, 0, os.fstat(dir_fd).st_gid, dir_fd=dir_fd, follow_symlinks=False)
                given += 1
    return given


def _daemons() -> Iterator[str]:
    """Start virtlogd and libvirtd where no service manager did. libvirtd then gets a configuration that opens
    its read-write socket to the libvirt group (there is no polkit daemon to ask, either); a libvirtd of ours
    whose socket is root's only is restarted so (its running VMs carry on)."""
    if not _daemon_running("virtlogd"):
        proc.run(
            ["virtlogd", "-d"], hint=f"is libvirt installed? `apt-get install {packages.TOOL_PACKAGES['virtlogd']}`"
        )
        yield "started virtlogd"
    if SERVICE_MANAGER.is_dir():
        if not _daemon_running("libvirtd"):
            raise VmsandboxError("libvirtd is not running", hint="start it: `systemctl start libvirtd`")
        return  # systemd's sockets are open to the group through polkit's rule for it
    running = _daemon_running("libvirtd")
    reaper = _reaper()
    if running and group_may_connect(DAEMONS["libvirtd"]) and (reaper is None or reaped(_pids("libvirtd"))):
        if reaper is None:
            yield NO_REAPER
        return
    if running:
        _stop_daemon("libvirtd")
    RUNTIME_CONF.parent.mkdir(parents=True, exist_ok=True)
    system = SYSTEM_CONF.read_text() if SYSTEM_CONF.exists() else ""
    filewrite.write_atomically(RUNTIME_CONF, group_access_conf(system), mode=0o644)
    done = "restarted" if running else "started"
    if reaper is None:
        proc.run(
            ["libvirtd", "-d", "--config", str(RUNTIME_CONF)],
            hint=f"is libvirt installed? `apt-get install {packages.TOOL_PACKAGES['libvirtd']}`",
        )
        yield f"{done} libvirtd (its socket open to the group {access.GROUP})"
        yield NO_REAPER
        return
    proc.spawn_detached(libvirtd_argv(reaper), log_file=LIBVIRTD_LOG)
    yield f"{done} libvirtd under {REAPER} (its socket open to the group {access.GROUP}; its QEMUs reaped at once)"


NO_REAPER = (
    f"libvirtd runs without {REAPER}: every VM stop waits until PID 1 reaps its QEMU (seconds, on some hosts); "
    f"`apt-get install {REAPER}` and run `vmsandbox host setup` again"
)


def libvirtd_argv(reaper: str) -> list[str]:
    """libvirtd in the foreground, the child of `reaper` registered as the subreaper of what it leaves."""
    return [reaper, "-s", "--", proc.which("libvirtd"), "--config", str(RUNTIME_CONF)]


def _reaper() -> str | None:
    try:
        return proc.which(REAPER)
    except VmsandboxError:
        return None


def reaped(pids: list[int], proc_root: Path = Path("/proc")) -> bool:
    """Whether every one of these libvirtd processes runs as the child of REAPER (else PID 1 reaps its QEMUs)."""
    for pid in pids:
        try:
            status = (proc_root / str(pid) / "status").read_text()
            parent = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
            if (proc_root / str(parent) / "comm").read_text().strip() != REAPER:
                return False
        except (OSError, StopIteration, ValueError, IndexError):
            return False
    return True


def group_access_conf(system: str) -> str:
    """libvirtd.conf: the system's settings, with the three that give the libvirt group the read-write socket
    in place of any of theirs."""
    keep = [line for line in system.splitlines() if line.partition("=")[0].strip() not in dict(GROUP_ACCESS)]
    return (
        "\n".join(
            [
                *keep,
                "# vmsandbox host setup: the libvirt group drives libvirt",
                *(f'{key} = "{value}"' for key, value in GROUP_ACCESS),
            ]
        )
        + "\n"
    )


def group_may_connect(sock: Path) -> bool:
    """Whether the libvirt group may use the read-write socket without polkit (which only a service manager
    runs): the socket is the group's. A socket open to all (0777) asks polkit, and fails without it."""
    try:
        st = sock.stat()
    except OSError:
        return False
    mode = stat.S_IMODE(st.st_mode)
    return st.st_gid == access.group_gid() and mode & 0o060 == 0o060


def _stop_daemon(name: str) -> None:
    for pid in _pids(name):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _daemon_running(name):
        if time.monotonic() > deadline:
            raise VmsandboxError(
                f"{name} did not stop within 30 s", hint=f"stop it by hand (`pkill {name}`), then rerun"
            )
        time.sleep(0.2)


def _join(user: str) -> Iterator[str]:
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise VmsandboxError(f"there is no user {user}", hint="name an existing account with --user") from None
    if access.listed_in_group(user):
        return
    proc.run(["usermod", "--append", "--groups", access.GROUP, user])
    yield f"added {user} to the group {access.GROUP}: they run vmsandbox without sudo once they log in again"
