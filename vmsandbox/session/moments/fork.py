"""`vmsandbox create --from NAME --name NEW` (a fork): an independent session made from another one's state — now
(a checkpoint is taken for it and dropped after) or at one of its checkpoints — with its processes, files and disks.

The fork gets copies, never shared files: its system disk is one overlay holding everything the source's
overlays held above their image (`qemu-img convert -B`), its workspace disk a copy (a reflink where the file
system can), its baseline the same captured project (so its review compares against the same starting point).
Its identity is its own: SSH host key and client key, hostname, egress daemon and policy, secret placeholders
and session CA, no published ports. The restored guest still holds the source's identity: on this machine the
source's `identity` (a warm start's, restored asleep with the source's memory) takes the new one on the fork's
identity port, as at a warm start, with no login; otherwise (a guest that does not listen there) the host logs in
once with the source's keys (pinned to the source's host key) and hands it over. From then on only the fork's
keys work. Processes that ran in the source run on in the fork (with the source's environment: new
logins get the fork's). A session on another host is forked there, from its checkpoint's volumes (how the
disks are copied and the VM restored is the place's: session.place).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable

from vmsandbox import paths, pids, proc, ui
from vmsandbox.confine import access, accounts
from vmsandbox.egress import control, policy
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands, identity, ssh
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.session import lock
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import checkpoint
from vmsandbox.session.place import checkpoints, choose, console, pins
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.interface import VM, Sharing
from vmsandbox.session.record import Phase, Record, validate_name
from vmsandbox.session.start import create
from vmsandbox.session.state import down, where
from vmsandbox.sync.fetch import delta
from vmsandbox.sync.inward import capture

# Run as root in the restored guest, the fork's identity (identity.bundle's tar) on stdin: the clock and the
# random generator first (the fork shares the source's memory), then the identity applied as a warm start
# does, then sshd reloaded with the new host key. The guest's identity program does it all in one process
# (`identity fork`, images/base/rootfs/usr/local/lib/vmsandbox/identity); the other branch is for the sessions
# of images older than that program (a shell script then, which takes only a directory), told apart by the
# shell's own `read` so that nothing else runs first. It returns once the reloaded sshd listens again (a
# socket of another inode on port 22, read from /proc/net/tcp by the shell alone, within 10 s): the host's
# next login is the fork's own, with no probe for the banner (each costs the guest a login's start-up).
REIDENTIFY = r"""set -eu
listening() {  # the inode of sshd's socket listening on port 22 (0.0.0.0), in $found ("" while none)
    found=
    while read -r _ local _ st _ _ _ _ _ inode _; do
        if [ "$st" = 0A ] && [ "$local" = 00000000:0016 ]; then found=$inode; fi
    done </proc/net/tcp
}
listening
before=$found
read -r first </usr/local/lib/vmsandbox/identity
case $first in
*python3*) /usr/local/lib/vmsandbox/identity fork >/dev/null ;;
*)
d=$(mktemp -d /run/vmsandbox-fork.XXXXXX)
tar -x -m -C "$d" -f -
date -s "@$(cat "$d/clock")" >/dev/null
perl -e 'open(my $s, "<", $ARGV[0]) or die; binmode $s; read($s, my $b, 4096);
    open(my $f, ">", "/dev/urandom") or die; binmode $f; syswrite($f, $b) or die;
    ioctl($f, 0x5207, 0) or die "reseed: $!\n"' "$d/seed"
rm -f "$d/seed" "$d/clock"
dev=$(findmnt -n -o SOURCE --target "$(cat "$d/workdir")" || true)
WORKSPACE_DEV=$dev /usr/local/lib/vmsandbox/identity "$d" >/dev/null
rm -rf /etc/vmsandbox/identity.d
cp -a "$d" /etc/vmsandbox/identity.d
rm -rf "$d"
systemctl reload ssh.service
;;
esac
i=0
while [ $i -lt 200 ]; do
    listening
    if [ -n "$found" ] && [ "$found" != "$before" ]; then break; fi
    i=$((i + 1))
    sleep 0.05
done
"""
IDENTITY_TIMEOUT = 120
PORT_ACK = 10.0  # a source's `identity`, restored asleep in the fork, says "taking" within this (else: a login)
LINE_SHOWN = 200  # characters of a console line a failed fork's error shows (escaped at the edge, as all it says)
REMOTE_CONSOLE_EVERY = 5.0  # seconds between fetches of a waited-for fork's console from another host (libvirt)


def fork(name: str, new: str, *, label: str | None = None) -> Record:
    new = validate_name(new)
    source = Record.load(name)
    if source.disk is not None:
        raise VmsandboxError(f"session {name} builds an image: it cannot be forked")
    with lock.held(source.files, name, f"forking {new} from"), choose.host_of(source) as host:
        source = Record.load(name)
        vm = host.vm(source)
        if label is not None:
            at = checkpoints.find(source.files, name, label)
            with vm.forks.share(at) as how:
                ui.info(f"  memory: {ui.printable(_shared(how))}")  # (it may quote a save image's names)
                return _make(vm, at, new, at=label)
        checkpoint.must_run(vm, "forked")
        _name_free(new)  # before the source is saved for it
        checkpoint.check_room(vm)  # the checkpoint taken for the fork may leave an overlay
        label = f"fork-{new}-{os.getpid()}"
        taken = checkpoint.live(vm, label, listed=False)  # the source runs on: paused for its save's last pass only
        live = taken is not None
        cp = taken if taken is not None else checkpoint.freeze(vm, label)
        failed: list[BaseException] = []
        try:
            # the fork maps the memory saved (one copy, where the place can); a source that was saved resumes on
            # the same copy while the fork is made (two guests come back at once: under TCG, on two CPUs)
            with vm.forks.share(cp) as how:
                ui.info(f"  memory: {ui.printable(_shared(how, live=live))}")  # (it may quote a save's names)
                if live:
                    return _make(vm, cp, new, at=None)
                waking = threading.Thread(target=_wake, args=(source, cp, failed))
                waking.start()
                try:
                    return _make(vm, cp, new, at=None)
                finally:
                    waking.join()
        finally:
            shutil.rmtree(cp.path, ignore_errors=True)
            host.vm(Record.load(name)).snapshots.drop(cp.label, live=True)
            for exc in failed:
                ui.warn(f"session {name} did not resume after the fork: {exc}")


def _name_free(new: str) -> None:
    if paths.session_paths(new).root.exists():
        raise VmsandboxError(f"a session named {new} already exists", hint="pick another name")


def _shared(how: Sharing, *, live: bool = False) -> str:
    """What the forks and their source share of a checkpoint's memory, in words (`live`: the source runs on its
    own, the fork alone maps it)."""
    if how.mapped is not None and live:
        return f"{how.mapped / 1024**2:.0f} MiB mapped copy-on-write by the fork (its source runs on its own)"
    if how.mapped is not None:
        return f"{how.mapped / 1024**2:.0f} MiB mapped copy-on-write, one copy for all"
    return f"each restores a copy ({how.unshared})"


def _wake(source: Record, cp: Checkpoint, failed: list[BaseException]) -> None:
    # its own connection: meanwhile the operation makes the fork on its connection, in the thread that waits here
    with ui.quiet(source.name), choose.vm_of(source) as vm:
        try:
            checkpoint.wake(vm, cp)
        except Exception as exc:  # noqa: BLE001 - reported by the thread that waits for this one
            failed.append(exc)


def _make(vm: VM, cp: Checkpoint, new: str, *, at: str | None) -> Record:
    """The fork NEW of the source session (`vm`) from `cp` (one of its checkpoints `at`, or None: one taken for
    this fork)."""
    source, files = vm.record, paths.session_paths(new)
    there = where(vm.host)
    accounts.state_dirs()
    try:
        files.root.mkdir(mode=0o700)
    except FileExistsError:
        raise VmsandboxError(f"a session named {new} already exists", hint="pick another name") from None
    accounts.private_dir(files.root)
    if os.geteuid() != 0:
        access.inherit_for_me(files.root)
    record = dataclasses.replace(
        source,
        name=new,
        created=time.time(),
        keep=True,
        owner_pid=os.getpid(),  # (while it is made: gc and `rm --stale` leave it be; none once it is ready)
        owner_start=pids.process_start(os.getpid()),
        status=Phase.CREATING,
        unsynced=None,
        saved=False,
        publish=(),
        overlays=[paths.SESSION_OVERLAY],
        ssh_port=vm.forks.ssh_port(),
        start="fork",
        start_note=f"forked from {source.name}" + (f" at checkpoint {at}" if at else "") + there,
        forked_from=f"{source.name}@{at}" if at else source.name,
        group=None,  # a fork of a fan-out's session is not one of the fan-out's
        boot_seconds=None,
        account=None,
    )
    made: VM | None = None
    try:
        record.save()
        pins.pin(new, record.image_version, record.template)
        with ui.step(f"Copying session {source.name}'s state{there}"):
            _copy_state(vm, cp, record)
        with ui.step("Preparing the fork (keys, identity, egress policy)"):
            _identity(source, record)
        started = time.monotonic()
        with ui.step(f"Restoring {record.domain} from it") as detail:
            made = vm.forks.restore(cp, record)
            detail("its own identity")
            handed = _hand_over_on_port(made)
            if handed is None:
                _hand_over_identity(source, made)
            record.identity_port = handed is not None and handed.serving
            spawned = control.spawn(create.daemon_spec(record), record.files) if record.wants_daemon else None
            _check_identity(made)
        record.boot_seconds = round(time.monotonic() - started, 1)
        if spawned is not None:
            with ui.step("Opening the fork's egress proxy"):
                control.wait_open(create.daemon_spec(record), record.files, spawned)
        record.status, record.owner_pid, record.owner_start = Phase.READY, None, None
        record.save()
    except BaseException as exc:
        try:
            if isinstance(exc, VmsandboxError) and made is not None and made.host.abilities.elsewhere:
                _fetch_console(made)  # another host's: here, for _undo to keep
        finally:
            _undo(record, exc)
        raise
    return record


def _undo(record: Record, exc: BaseException) -> None:
    """A fork that failed: removed, whatever happens here. Once its VM ran, its console is kept where it outlives
    the fork (console.keep), and what it says of a failure (a panic, an oops: the guest's lines, cut and escaped)
    goes into the error (`exc`, which keeps its type)."""
    try:
        if isinstance(exc, VmsandboxError) and console.size_of(record.files.console_log):
            kept = console.keep(record.files.console_log, record.name)
            if kept is not None:
                lines = console.trouble(console.read(kept))
                found = "".join(f"\n  {ui.printable(line[:LINE_SHOWN], markup=False)}" for line in lines)
                exc.message += f"\nThe fork's console reports:{found}" if found else ""
                exc.hint = f"the fork's console is kept at {kept}" + (f"; {exc.hint}" if exc.hint else "")
    except OSError as failed:  # (a full disk, say: the fork goes all the same)
        ui.warn(f"the fork's console could not be kept: {failed.strerror or failed}")
    finally:
        lifecycle.remove(record)


def _alive(fork: VM) -> Callable[[], str | None]:
    """None while the fork's VM runs and its kernel has not panicked (its console says so), else why not. The
    console of a fork on another host is fetched here for it, at most every REMOTE_CONSOLE_EVERY seconds."""
    fetched = -REMOTE_CONSOLE_EVERY

    def why() -> str | None:
        nonlocal fetched
        if (gone := down(fork)) is not None:
            return gone
        if fork.host.abilities.elsewhere and time.monotonic() - fetched >= REMOTE_CONSOLE_EVERY:
            _fetch_console(fork)
            fetched = time.monotonic()
        return console.panicked(fork.record.files.console_log)

    return why


def _fetch_console(fork: VM) -> None:
    """The console of a fork on another host, copied into its console log here (as far as its host has it)."""
    with contextlib.suppress(Exception):  # (not there yet, its host did not answer: none read; the wait goes on)
        fork.console(follow=False)


def _copy_state(vm: VM, cp: Checkpoint, record: Record) -> None:
    """The fork's (`record`) disks, baseline and (a fresh) mirror, copied from the source (`vm`) at the
    checkpoint."""
    src, files = vm.record.files, record.files
    workspace = vm.forks.copy_disks(cp, record)  # None: the place made it, with the system disk
    capture.copy_from(src, files, workspace)
    for f in (src.decisions, src.hashes("project")):
        if f.exists():
            shutil.copyfile(f, files.root / f.name)
    # the guest's tree is not the baseline's any more: with no record of the mirror, the first pull walks it
    delta.forget(files.root)


def _identity(source: Record, record: Record) -> None:
    """The fork's keys, identity files (the source's, with its own hostname, keys, placeholders and CA) and
    egress policy."""
    files = record.files
    client_pub = ssh.generate_key(files.client_key, f"vmsandbox-{record.name}")
    ssh.generate_key(files.host_key, f"vmsandbox-{record.name}-host")
    fw = files.fwcfg_dir
    fw.mkdir(mode=0o700)
    for f in source.files.fwcfg_dir.iterdir():  # contents only: libvirt's xattrs on them name the source's VM
        if stat.S_ISREG(f.lstat().st_mode):  # (files the host made: never what a link there leads to)
            shutil.copyfile(f, fw / f.name, follow_symlinks=False)
    (fw / "hostname").write_text(f"vmsandbox-{record.name}\n")
    (fw / "authorized_keys").write_text(client_pub + "\n")
    shutil.copyfile(files.host_key, fw / "host_key")
    (fw / policy.FWCFG_CA).unlink(missing_ok=True)
    swapped = policy.rekey(source.files, record.name, files)
    env = (fw / "env").read_text() if (fw / "env").exists() else ""
    for old, new in swapped.items():
        env = env.replace(old, new)
    (fw / "env").write_text(env)


def _hand_over_on_port(fork: VM) -> identity.Handed | None:
    """The fork's identity on its identity port, where its source's guest listens (record.identity_port: the
    source said so at its warm start; its `identity` was restored with its memory), on this machine; None when
    it was not taken there (the host logs in with the source's keys instead)."""
    record = fork.record
    if not record.identity_port or fork.host.abilities.elsewhere:
        return None
    files = record.files
    try:
        return identity.hand_over(
            files.identity_socket, files.fwcfg_dir, ack=PORT_ACK, timeout=IDENTITY_TIMEOUT, alive=_alive(fork)
        )
    except identity.NotListeningError as exc:  # its guest rebooted, or its root ended what listened
        ui.warn(f"{exc.message}; handing it over with a login instead")
        return None


def _hand_over_identity(source: Record, fork: VM) -> None:
    """Log in with the source's keys (the restored guest's) and hand over the fork's identity."""
    record = fork.record
    files = record.files
    bridge = paths.SessionPaths(files.root / "fork-bridge")
    bridge.root.mkdir(mode=0o700)
    try:
        shutil.copyfile(source.files.client_key, bridge.client_key)
        bridge.client_key.chmod(0o600)
        ssh.write_known_hosts(bridge, record.ssh_port, source.files.host_key.with_suffix(".pub").read_text())
        once = Endpoint(record.name, record.ssh_port, "root", bridge)
        once.write_config()
        argv = [*once.ssh_argv("-T", "-o", "ControlMaster=no"), "--", REIDENTIFY]
        # the source's sshd came back with its memory: no probe first, unless the login finds none
        handed = proc.run(argv, input=identity.bundle(files.fwcfg_dir), timeout=IDENTITY_TIMEOUT, check=False)
        if handed.returncode == commands.SSH_FAILED:
            ssh.wait_for_banner(record.ssh_port, timeout=60, alive=_alive(fork))
            handed = proc.run(argv, input=identity.bundle(files.fwcfg_dir), timeout=IDENTITY_TIMEOUT, check=False)
        if handed.returncode != 0:
            raise proc.CommandError(handed)
    finally:
        shutil.rmtree(bridge.root, ignore_errors=True)


def _check_identity(fork: VM) -> None:
    """The fork's own keys log in, and its sshd presents the host key pinned for it."""
    record = fork.record
    # the hand-over returned once the reloaded sshd listened; should it not be there yet, wait for its banner
    for attempt in range(20):
        if attempt:
            time.sleep(0.25)
            ssh.wait_for_banner(record.ssh_port, timeout=60, alive=_alive(fork))
        answer = commands.run_as_root(record.endpoint(), "true", check=False, timeout=60)
        if answer.returncode != commands.SSH_FAILED:
            break
    commands.run_as_root(record.endpoint(), "true", timeout=60, hint="the fork did not take its new identity")
