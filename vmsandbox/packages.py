"""Which Debian package provides each tool vmsandbox runs: a missing tool is reported with its package."""

from __future__ import annotations

from collections.abc import Mapping

TOOL_PACKAGES: Mapping[str, str] = {
    "qemu-img": "qemu-utils",
    "qemu-system-x86_64": "qemu-system-x86",
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "chroot": "coreutils",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
    "virtlogd": "libvirt-daemon-system",
    "libvirtd": "libvirt-daemon-system",
    "tini": "tini",
    "git": "git",
    "mount": "mount",
    "bwrap": "bubblewrap",
    "debugfs": "e2fsprogs",
    "e2fsck": "e2fsprogs",
    "cp": "coreutils",
    "umount": "mount",
    "useradd": "passwd",
}
