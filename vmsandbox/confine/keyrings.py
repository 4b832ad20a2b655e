"""A session account's keyrings, emptied before its id serves a session: the kernel keeps an account's user and
user-session keyrings after its last process has ended, so what one session's QEMU (a guest that took it over)
left there would be the next session's of the same id — a message for it, or the account's key quota used up.

Started by root (`python -I -m vmsandbox.confine.keyrings UID`, owned.forget_keys through proc), it becomes that
account once its modules are loaded (a checkout root alone may read stays so), as no process of root's reaches
another account's user keyrings. Asking for them makes them where there were none (40 bytes of the account's own
quota)."""

from __future__ import annotations

import ctypes
import os
import sys

SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219}  # keyctl(2)'s number; glibc has no wrapper
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5


def clear() -> None:
    """Empty this process's account's user and user-session keyrings (their keys unlinked: those linked nowhere
    else go)."""
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        raise OSError(f"keyctl's system call number on {os.uname().machine} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        if libc.syscall(number, KEYCTL_CLEAR, ring) < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"keyctl clear of keyring {ring}: {os.strerror(code)}")


def become(uid: int) -> None:
    """This process as account `uid` (its own group, no other), for good."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def main(argv: list[str]) -> int:
    try:
        become(int(argv[0]))
        clear()
    except OSError as exc:
        print(f"vmsandbox-keyrings: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
