"""A fork's own identity (moments/fork.py makes the fork): its keys and identity files made here, handed over to its
restored guest, which still holds its source's, and checked; and the watch on the fork meanwhile (its VM runs, its
kernel has not panicked).

The hand-over is on the fork's identity port where its source's guest listens there (its `identity`, restored
asleep with the source's memory, takes the new one as at a warm start, with no login); otherwise the host logs in
once with the source's keys (pinned to the source's host key) and hands it over. From then on only the fork's keys
work.
"""

from __future__ import annotations

import contextlib
import shutil
import stat
import time
from collections.abc import Callable

from vmsandbox import paths, proc, ui
from vmsandbox.egress import policy
from vmsandbox.guest import commands, identity, ssh
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.session.place import console
from vmsandbox.session.place.interface import VM
from vmsandbox.session.record import Record
from vmsandbox.session.state import down

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
REMOTE_CONSOLE_EVERY = 5.0  # seconds between fetches of a waited-for fork's console from another host (libvirt)


def prepare(source: Record, record: Record) -> None:
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


def hand_over(source: Record, fork: VM) -> bool:
    """The fork's identity (made by `prepare`) taken by its restored guest: on its identity port, else by a login
    with the source's keys. Whether the guest's `identity` goes on serving that port (record.identity_port)."""
    handed = _on_port(fork)
    if handed is None:
        _by_login(source, fork)
    return handed is not None and handed.serving


def _on_port(fork: VM) -> identity.Handed | None:
    """The fork's identity on its identity port, where its source's guest listens (record.identity_port: the
    source said so at its warm start; its `identity` was restored with its memory), on this machine; None when
    it was not taken there (the host logs in with the source's keys instead)."""
    record = fork.record
    if not record.identity_port or fork.host.abilities.elsewhere:
        return None
    files = record.files
    try:
        return identity.hand_over(
            files.identity_socket, files.fwcfg_dir, ack=PORT_ACK, timeout=IDENTITY_TIMEOUT, alive=alive(fork)
        )
    except identity.NotListeningError as exc:  # its guest rebooted, or its root ended what listened
        ui.warn(f"{exc.message}; handing it over with a login instead")
        return None


def _by_login(source: Record, fork: VM) -> None:
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
            ssh.wait_for_banner(record.ssh_port, timeout=60, alive=alive(fork))
            handed = proc.run(argv, input=identity.bundle(files.fwcfg_dir), timeout=IDENTITY_TIMEOUT, check=False)
        if handed.returncode != 0:
            raise proc.CommandError(handed)
    finally:
        shutil.rmtree(bridge.root, ignore_errors=True)


def check(fork: VM) -> None:
    """The fork's own keys log in, and its sshd presents the host key pinned for it."""
    record = fork.record
    # the hand-over returned once the reloaded sshd listened; should it not be there yet, wait for its banner
    for attempt in range(20):
        if attempt:
            time.sleep(0.25)
            ssh.wait_for_banner(record.ssh_port, timeout=60, alive=alive(fork))
        answer = commands.run_as_root(record.endpoint(), "true", check=False, timeout=60)
        if answer.returncode != commands.SSH_FAILED:
            break
    commands.run_as_root(record.endpoint(), "true", timeout=60, hint="the fork did not take its new identity")


def alive(fork: VM) -> Callable[[], str | None]:
    """None while the fork's VM runs and its kernel has not panicked (its console says so), else why not. The
    console of a fork on another host is fetched here for it, at most every REMOTE_CONSOLE_EVERY seconds."""
    fetched = -REMOTE_CONSOLE_EVERY

    def why() -> str | None:
        nonlocal fetched
        if (gone := down(fork)) is not None:
            return gone
        if fork.host.abilities.elsewhere and time.monotonic() - fetched >= REMOTE_CONSOLE_EVERY:
            fetch_console(fork)
            fetched = time.monotonic()
        return console.panicked(fork.record.files.console_log)

    return why


def fetch_console(fork: VM) -> None:
    """The console of a fork on another host, copied into its console log here (as far as its host has it)."""
    with contextlib.suppress(Exception):  # (not there yet, its host did not answer: none read; the wait goes on)
        fork.console(follow=False)
