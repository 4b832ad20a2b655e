"""A stand-in for a remote libvirt host, on this machine: a second libvirtd in a mount namespace of its own,
reached as `qemu+ssh://` through an sshd started here on 127.0.0.1.

The namespace has a private /run (so its libvirt socket is not ours, and ours is not its), and its own
/etc/libvirt (a copy), /var/lib/libvirt and /var/log/libvirt bound over ours: what it stores, the client
cannot see at the paths it reports. sshd runs inside the same namespace, so an ssh session's libvirt socket
is the second daemon's. The network namespace is shared: all traffic stays on loopback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")

_START = r"""
set -eu
R="$1"
mount -t tmpfs -o mode=0755 vmsandbox-farhost-run /run
mkdir -p /run/libvirt /run/sshd /run/lock
mount --bind "$R/etc-libvirt" /etc/libvirt
mount --bind "$R/lib-libvirt" /var/lib/libvirt
mount --bind "$R/log-libvirt" /var/log/libvirt
/usr/sbin/virtlogd -d
/usr/sbin/libvirtd -d
/usr/sbin/sshd -f "$R/sshd_config"
for i in $(seq 100); do
    [ -S /run/libvirt/libvirt-sock ] && [ -s "$R/sshd.pid" ] && break
    sleep 0.1
done
echo "$(cat /run/virtlogd.pid) $(cat /run/libvirtd.pid) $(cat "$R/sshd.pid")" > "$R/pids"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FarHost:
    root: Path
    port: int
    pids: list[int]

    @property
    def ssh(self) -> Path:
        """An ssh that knows the stand-in (its key, its host key): libvirt's `command=`."""
        return self.root / "ssh"

    @property
    def uri(self) -> str:
        return f"qemu+ssh://root@127.0.0.1:{self.port}/system?command={self.ssh}&no_tty=1"

    def run_inside(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A command in the stand-in's mount namespace (what the remote host's own shell would see)."""
        return subprocess.run(
            ["nsenter", "-t", str(self.pids[1]), "-m", "--", *argv], capture_output=True, text=True, check=False
        )

    def restart_libvirtd(self) -> None:
        """Its libvirtd stopped and started again (what a restart of the daemon on a real host does)."""
        os.kill(self.pids[1], signal.SIGTERM)
        deadline = time.monotonic() + 15
        while Path(f"/proc/{self.pids[1]}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        inside = ["nsenter", "-t", str(self.pids[2]), "-m", "--"]  # sshd's: the same namespace
        subprocess.run([*inside, "/usr/sbin/libvirtd", "-d"], check=True, timeout=30)
        for _ in range(100):
            found = subprocess.run([*inside, "cat", "/run/libvirtd.pid"], capture_output=True, text=True, check=False)
            if found.stdout.strip().isdigit() and int(found.stdout) != self.pids[1]:
                self.pids[1] = int(found.stdout)
                break
            time.sleep(0.1)
        for _ in range(100):
            if self.run_inside("virsh", "-c", "qemu:///system", "version").returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("the stand-in's libvirtd did not come back")

    def stop(self) -> None:
        """Its domains destroyed (a failed test may leave one: its QEMU would outlive the daemon), then the
        daemons stopped."""
        listed = self.run_inside("virsh", "-c", "qemu:///system", "list", "--name")
        for domain in listed.stdout.split():
            self.run_inside("virsh", "-c", "qemu:///system", "destroy", domain)
        for pid in reversed(self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in self.pids):
            time.sleep(0.1)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start(root: Path) -> FarHost:
    """Start the stand-in under `root` (which must not exist yet)."""
    if not SSHD.exists():
        raise RuntimeError(f"{SSHD} is missing: apt-get install openssh-server")
    root.mkdir(mode=0o700)
    for sub in ("lib-libvirt", "log-libvirt"):
        (root / sub).mkdir()
    shutil.copytree("/etc/libvirt", root / "etc-libvirt", symlinks=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", root / "host_key"], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", root / "client_key"], check=True)
    shutil.copyfile(root / "client_key.pub", root / "authorized_keys")
    port = free_port()
    (root / "sshd_config").write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {root / 'host_key'}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "AllowTcpForwarding yes",
                "PermitTunnel no",
                "X11Forwarding no",
                "",
            ]
        )
    )
    host_pub = (root / "host_key.pub").read_text().split()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (root / "ssh").write_text(
        "#!/bin/sh\n"
        f"exec ssh -i {root / 'client_key'} -o IdentitiesOnly=yes -o UserKnownHostsFile={root / 'known_hosts'} "
        f'-o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 "$@"\n'
    )
    (root / "ssh").chmod(0o755)
    subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", _START, "farhost", str(root)],
        check=True,
        timeout=60,
    )
    pids = [int(p) for p in (root / "pids").read_text().split()]
    return FarHost(root, port, pids)
