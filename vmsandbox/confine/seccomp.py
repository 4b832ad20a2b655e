"""The seccomp filter of the jail (jail.py): the system calls a reader of guest bytes never needs, refused.

A process that parses guest bytes (rsync's receiver, git, a merge, the credential scan, the highlighter) reads
and writes files, maps memory, forks and execs its own helpers, and talks over pipes and socket pairs. It never
needs to reach into the kernel's larger surfaces, each of which has carried privilege escalations: new
namespaces (a user namespace hands out full capabilities over its own mounts and network), mounts, the keyring,
BPF, perf events, userfaultfd, io_uring, ptrace and the other process-memory calls, kernel modules and kexec,
handles to files by number, the clock, swap, reboot, accounting, and pushing input into a terminal (TIOCSTI).

The filter is classic BPF, built here as data (no libseccomp on the host): it checks the architecture (another
ABI's numbers would mean other calls: x32 and any architecture the table does not know are refused whole),
then refuses each listed call with EPERM, `clone` only when its flags ask for a namespace, and `clone3`
(whose flags sit behind a pointer BPF cannot follow) with ENOSYS, so glibc falls back to `clone`. Everything
else is allowed: a filter that allows what rsync, git and Python happen to call today would break with the
next glibc; the calls refused are those no file reader has a use for.

bubblewrap loads it (`--seccomp FD`) after it has built the jail and just before it runs the command, so the
jail itself is built with the calls the filter then takes away.
"""

from __future__ import annotations

import os
import platform
import struct

# linux/audit.h
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000

# Refused calls, by name; each architecture's numbers below (unistd.h). A name missing from an architecture's
# table does not exist there.
REFUSED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "open_tree", "move_mount", "mount_setattr", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace", "process_vm_readv",
    "process_vm_writev", "pidfd_getfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "open_by_handle_at", "name_to_handle_at", "swapon", "swapoff", "reboot", "acct", "quotactl",
    "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "lookup_dcookie", "vhangup",
    "personality", "iopl", "ioperm", "uselib", "memfd_secret", "modify_ldt",
)  # fmt: skip

NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "open_tree": 428, "move_mount": 429,
        "mount_setattr": 442, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "pidfd_getfd": 438, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "open_by_handle_at": 304, "name_to_handle_at": 303, "swapon": 167, "swapoff": 168,
        "reboot": 169, "acct": 163, "quotactl": 179, "syslog": 103, "settimeofday": 164, "clock_settime": 227,
        "clock_adjtime": 305, "adjtimex": 159, "lookup_dcookie": 212, "vhangup": 153, "personality": 135,
        "iopl": 172, "ioperm": 173, "uselib": 134, "memfd_secret": 447, "modify_ldt": 154,
        "clone": 56, "clone3": 435, "ioctl": 16, "socket": 41,
    },
    "aarch64": {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "open_tree": 428, "move_mount": 429,
        "mount_setattr": 442, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "pidfd_getfd": 438, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "open_by_handle_at": 265, "name_to_handle_at": 264, "swapon": 224, "swapoff": 225,
        "reboot": 142, "acct": 89, "quotactl": 60, "syslog": 116, "settimeofday": 170, "clock_settime": 112,
        "clock_adjtime": 266, "adjtimex": 171, "lookup_dcookie": 18, "vhangup": 58, "personality": 92,
        "memfd_secret": 447,
        "clone": 220, "clone3": 435, "ioctl": 29, "socket": 198,
    },
}  # fmt: skip

# clone(2) flags that make a namespace (linux/sched.h)
NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
TIOCSTI = 0x5412
# socket families that reach past the jail's empty network namespace: the host's VM sockets, the kernel's crypto
AF_ALG, AF_VSOCK = 38, 40

# classic BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_KILL = 0x80000000  # SECCOMP_RET_KILL_PROCESS
RET_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38
# offsets in struct seccomp_data: nr (int), arch (u32), instruction pointer (u64), args[6] (u64 each)
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24


class UnknownArchitectureError(Exception):
    """No syscall table for this machine's architecture."""


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def program(arch: str | None = None) -> bytes:
    """The filter for `arch` (default: this machine's) as the bytes bubblewrap's `--seccomp` reads."""
    arch = arch or platform.machine()
    if arch not in NUMBERS:
        raise UnknownArchitectureError(arch)
    nr = NUMBERS[arch]
    deny = _insn(_RET_K, RET_ERRNO | EPERM)
    out = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, AUDIT_ARCH[arch], jt=1),
        _insn(_RET_K, RET_KILL),  # another ABI's numbers: nothing of it runs
        _insn(_LD_W_ABS, _NR),
    ]
    if arch == "x86_64":
        out += [_insn(_JGE_K, X32_BIT, jf=1), deny]  # the x32 ABI: its numbers carry this bit
    for name in REFUSED:
        if name in nr:
            out += [_insn(_JEQ_K, nr[name], jf=1), deny]
    out += [_insn(_JEQ_K, nr["clone3"], jf=1), _insn(_RET_K, RET_ERRNO | ENOSYS)]
    # clone with a namespace flag (the low 32 bits of its first argument hold every flag)
    out += [
        _insn(_JEQ_K, nr["clone"], jf=3),
        _insn(_LD_W_ABS, _ARG0),
        _insn(_JSET_K, NAMESPACE_FLAGS, jf=1),
        deny,
        _insn(_LD_W_ABS, _NR),
    ]
    # socket(AF_VSOCK or AF_ALG, ...)
    out += [
        _insn(_JEQ_K, nr["socket"], jf=4),
        _insn(_LD_W_ABS, _ARG0),
        _insn(_JEQ_K, AF_VSOCK, jt=1),
        _insn(_JEQ_K, AF_ALG, jf=1),
        deny,
        _insn(_LD_W_ABS, _NR),
    ]
    # ioctl(fd, TIOCSTI, ...): typing into the terminal (the jail's new session already has none)
    out += [
        _insn(_JEQ_K, nr["ioctl"], jf=3),
        _insn(_LD_W_ABS, _ARG1),
        _insn(_JEQ_K, TIOCSTI, jf=1),
        deny,
    ]
    out.append(_insn(_RET_K, RET_ALLOW))
    return b"".join(out)


def memfd(arch: str | None = None) -> int | None:
    """An inheritable file descriptor holding the filter, read from its start (bubblewrap's `--seccomp FD`);
    None on an architecture without a table (the jail then runs without it, and says so in the log)."""
    try:
        data = program(arch)
    except UnknownArchitectureError:
        return None
    fd = os.memfd_create("vmsandbox-seccomp", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
