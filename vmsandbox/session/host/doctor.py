"""`vmsandbox doctor`: every check a session needs, each failure with the exact fix."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import paths, proc, trust
from vmsandbox.confine import access, accounts, pool
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import build, recipe, store
from vmsandbox.session import settings
from vmsandbox.session.place import choose
from vmsandbox.session.settings import Settings
from vmsandbox.vm import accel, hostsetup
from vmsandbox.vm.memory import foreign

MIN_SESSION_FREE = 2 * 1024**3
SKIPPED_FIX = (
    "a process of QEMU's account put something else than a memory file at a holder's or a QEMU's descriptor: "
    "`sudo vmsandbox rm --stale` stops such a holder (the next warm start seals a fresh copy); see what runs as "
    "QEMU's account (`ps -u libvirt-qemu`)"
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    blocking: bool = True  # a failure here means a session cannot start

    @property
    def level(self) -> str:
        if self.ok:
            return "ok"
        return "fail" if self.blocking else "warn"


def _tool(tool: str, why: str, *, blocking: bool = True) -> Check:
    try:
        where = proc.which(tool)
    except VmsandboxError as exc:
        return Check(tool, False, f"missing ({why})", exc.hint, blocking)
    return Check(tool, True, where)


def _libvirt(uri: str) -> Check:
    try:
        with choose.host(choose.spec_for(None, uri)) as host:
            return Check("libvirt", True, f"libvirt {host.libvirt().version()} at {uri}")
    except VmsandboxError as exc:
        return Check("libvirt", False, exc.message, exc.hint)


def _memory(uri: str) -> Check:
    """Whether warm starts map their template's memory (shared) or load a copy each, and why."""
    name = "shared memory"
    try:
        with choose.host(choose.spec_for(None, uri)) as host:
            why = host.facts.memory_problem(host.libvirt().node())
    except VmsandboxError as exc:
        return Check(name, False, f"not checked: {exc.message}", exc.hint, blocking=False)
    skipped = foreign.notes()  # what root's looks at the holders and QEMUs here passed over (reading the node)
    if why is None and skipped:
        said = "warm starts and forks map their memory copy-on-write, but root's look " + "; ".join(skipped)
        return Check(name, False, said, SKIPPED_FIX, blocking=False)
    if why is None:
        return Check(name, True, "warm starts and forks map their memory copy-on-write, one copy for all")
    fix = "run vmsandbox as root (`sudo`)" if os.geteuid() != 0 else "libvirt's QEMU under its own account, DAC only"
    return Check(name, False, f"each session loads a copy of its memory: {why}", fix, blocking=False)


def _kvm_device() -> Check:
    if not accel.KVM_DEVICE.exists():
        return Check("/dev/kvm permissions", True, "no /dev/kvm (TCG only)")
    if hostsetup.kvm_permissions_ok():
        return Check("/dev/kvm permissions", True, "group kvm, mode 0660")
    return Check(
        "/dev/kvm permissions",
        False,
        "not group kvm/0660: libvirt re-probes QEMU on every VM start (~60 s each)",
        "`sudo vmsandbox host setup` (or: chgrp kvm /dev/kvm && chmod 0660 /dev/kvm)",
        blocking=False,
    )


def _accel(config: Settings) -> Check:
    try:
        choice = accel.choose(config.accel)
    except VmsandboxError as exc:
        return Check("accelerator", False, exc.message, exc.hint)
    if choice.accel is accel.Accel.KVM:
        return Check("accelerator", True, f"KVM ({choice.reason})")
    if config.accel is accel.Accel.TCG:
        return Check("accelerator", True, f"TCG, as configured — {choice.reason}")
    return Check(
        "accelerator",
        False,
        f"TCG — {choice.reason}",
        "use a host whose CPU has hardware virtualisation (vmx/svm) and /dev/kvm; `accel: tcg` in "
        "~/.config/vmsandbox/config.yaml makes this choice explicit",
        blocking=False,
    )


def _disk(path: Path, label: str, need: int) -> Check:
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    ok = free >= need
    return Check(
        f"free disk ({label})",
        ok,
        f"{free / 1024**3:.1f} GiB free at {probe}",
        None if ok else f"free space there or set VMSANDBOX_{label.upper()}_DIR to a bigger disk",
    )


def _account() -> Check:
    if os.geteuid() != 0:
        return Check("guest-data account", True, "not needed: vmsandbox runs unprivileged")
    if accounts.account() is not None:
        return Check("guest-data account", True, f"{accounts.ACCOUNT} (reads what comes out of guests)")
    return Check(
        "guest-data account",
        False,
        f"{accounts.ACCOUNT} is missing: nothing may read a guest's files without it",
        "`sudo vmsandbox host setup`",
    )


def _session_accounts() -> Check:
    """Whether each session's QEMU runs under an account of its own (confine.pool)."""
    name = "session accounts"
    if os.geteuid() != 0:
        return Check(name, True, "not used: vmsandbox runs unprivileged (its sessions' QEMUs run as libvirt's account)")
    made = pool.load()
    if made is None:
        return Check(
            name,
            False,
            "no pool: every session's QEMU runs as libvirt's one account, and a fork's memory is not shared",
            "`sudo vmsandbox host setup`",
            blocking=False,
        )
    held = len(pool.leased())
    last = made.first + made.count - 1
    return Check(name, True, f"one per session, from {made.first}-{last} ({held} of {made.count} in use)")


def _group() -> Check:
    """Without root, the libvirt group is what lets us drive qemu:///system (its socket) and add to the store."""
    name = "libvirt group"
    if os.geteuid() == 0:
        return Check(name, True, "not needed: running as root")
    gid = access.group_gid()
    if gid is None:
        return Check(name, False, f"there is no group {access.GROUP}", "`sudo vmsandbox host setup --user $USER`")
    if gid in os.getgroups() or gid == os.getegid():
        return Check(name, True, f"you are in {access.GROUP}")
    me = access.me()
    if access.listed_in_group(me):
        return Check(
            name,
            False,
            f"you were added to {access.GROUP} after this login began",
            f"log in again (or start a shell in the group: `newgrp {access.GROUP}`)",
        )
    return Check(
        name,
        False,
        f"you ({me}) are not in the group {access.GROUP}: libvirt refuses you",
        f"`sudo vmsandbox host setup --user {me}`, then log in again",
    )


def _store() -> Check:
    images = paths.images_dir()
    if os.geteuid() == 0 or os.access(images, os.W_OK | os.X_OK):
        return Check("image store", True, f"{images} (you may add blueprint layers and templates)")
    return Check(
        "image store",
        False,
        f"{images} is not writable for you: blueprint layers and warm-start templates cannot be built (sessions "
        "of the images there still run; cold where no template exists)",
        "`sudo vmsandbox host setup` shares it with the libvirt group",
        blocking=False,
    )


def _image() -> Check:
    images = store.list_images()
    if not images:
        return Check("base image", False, f"none built in {paths.images_dir()}", "`sudo vmsandbox image build`")
    try:
        wanted = recipe.load_recipe().version
    except VmsandboxError as exc:
        return Check("base image", False, exc.message, exc.hint)
    if any(i.version == wanted for i in images):
        return Check("base image", True, f"{wanted} (current recipe)")
    return Check(
        "base image",
        True,
        f"{images[0].version} (older recipe; current is {wanted})",
        "`sudo vmsandbox image build` to update",
        blocking=False,
    )


def diagnose(project: Path | None) -> list[Check]:
    """Every check, the config's first: a broken config is one failed check (every problem of it said, each
    at its line with its hint), and the others run with what of it passes — the diagnosis never stops at it."""
    first, config = config_check(project)
    return [first, *run_checks(config)]


def config_check(project: Path | None) -> tuple[Check, Settings]:
    """The check of your config and `project`'s `.vmsandbox.yaml`, and the settings as far as they pass (your
    own only, when the project's file is not trusted)."""
    config, broken = settings.load_lenient(project)
    problems = [e for e in broken if not isinstance(e, trust.UntrustedError)]
    untrusted = next((e for e in broken if isinstance(e, trust.UntrustedError)), None)
    own = None if untrusted is None else f"{untrusted.message}: checked with your own settings only"
    if problems:
        said = [e.message + (f"\n  hint: {e.hint}" if e.hint else "") for e in problems]
        said += [] if untrusted is None else [f"{own}\n  hint: {untrusted.hint}"]
        fix = "fix each problem where it is said (`vmsandbox config validate` checks again)"
        return Check("config", False, "\n".join(said), fix), config
    if untrusted is not None and own is not None:
        return Check("config", False, own, untrusted.hint, blocking=False), config
    return Check("config", True, "every setting read (`vmsandbox config show` lists them)"), config


def run_checks(config: Settings) -> list[Check]:
    have_image = bool(store.list_images())
    checks: list[Callable[[], Check]] = [
        lambda: _tool("qemu-system-x86_64", "runs the VMs"),
        lambda: _tool("qemu-img", "makes the per-session overlays"),
        lambda: _libvirt(config.libvirt_uri),
        lambda: _memory(config.libvirt_uri),
        _kvm_device,
        _account,
        _session_accounts,
        _group,
        _store,
        lambda: _accel(config),
        lambda: _tool("ssh", "the control channel"),
        lambda: _tool("ssh-keygen", "per-session keys"),
        lambda: _tool("rsync", "moves the workspace"),
        lambda: _tool("debootstrap", "builds the base image", blocking=not have_image),
        lambda: _tool("mkfs.ext4", "builds the base image", blocking=not have_image),
        lambda: _disk(paths.data_dir(), "data", build.MIN_FREE_BYTES if not have_image else MIN_SESSION_FREE),
        lambda: _disk(paths.state_dir(), "state", MIN_SESSION_FREE),
        _image,
    ]
    return [check() for check in checks]
