"""Stand-ins for what a process of QEMU's account can put where root looks (used by test_foreign_descriptors.py and
test_shared_memory.py): a FUSE file whose close by root is never answered (fuse_standin.py), and a process of
QEMU's account that keeps it at a descriptor number or races it there (descriptor_standin.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import URI, wait_for
from vmsandbox import pids
from vmsandbox.vm.virt import Hypervisor

HERE = Path(__file__).parent
NUMBER = 10  # the descriptor number the stand-in process keeps its file at
STOP_TIMEOUT = 30.0


@dataclass(frozen=True)
class FuseFile:
    path: Path
    log: Path

    def held_flushes(self) -> list[int]:
        """The pids of the processes whose close (a FLUSH from root) the file system never answered."""
        lines = self.log.read_text().splitlines()
        return [int(line.split()[2]) for line in lines if line.split()[1] == "0" and line.endswith("held")]


@contextlib.contextmanager
def never_closing(tmp: Path) -> Iterator[FuseFile]:
    """A FUSE file whose close by root never ends while this lasts (after it, the file system goes and every close
    still waiting ends with an error)."""
    if not Path("/dev/fuse").exists():
        pytest.skip("no /dev/fuse here: the FUSE stand-in cannot be mounted")
    mountpoint, log = tmp / "mnt", tmp / "flushes"
    mountpoint.mkdir()
    log.touch()
    argv = [sys.executable, "-I", str(HERE / "fuse_standin.py"), str(mountpoint), str(log)]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            server.wait(STOP_TIMEOUT)
            pytest.skip(f"the FUSE stand-in could not mount here: {server.stderr.read() if server.stderr else ''}")
        yield FuseFile(mountpoint / "held", log)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(STOP_TIMEOUT)


@dataclass(frozen=True)
class StandIn:
    """A process of QEMU's account with a file of its choosing at `number`; `ino` and `size`: its sealed memfd's."""

    process: subprocess.Popen[str]
    pid: int
    number: int
    ino: int
    size: int

    def record(self, template: str) -> dict[str, object]:
        """What root's record of a holder would say of it (sealed.Held's fields), for `template`."""
        start = pids.process_start(self.pid)
        return {
            "pid": self.pid,
            "start": start,
            "fd": self.number,
            "ino": self.ino,
            "size": self.size,
            "template": template,
        }


def qemu_account() -> tuple[int, int]:
    with Hypervisor(URI) as hv:
        return hv.confinement().accounts["qemu"]


@contextlib.contextmanager
def qemu_account_process(mode: str, file: FuseFile, *args: str) -> Iterator[StandIn]:
    """descriptor_standin.py as QEMU's account: `hold` keeps the FUSE file at NUMBER, `race` swaps it there with a
    sealed memfd without end. `args`: more words on its command line (a QEMU's `guest=NAME,`)."""
    uid, gid = qemu_account()
    script = str(HERE / "descriptor_standin.py")
    argv = [sys.executable, "-I", script, mode, str(file.path), str(uid), str(gid), str(NUMBER), *args]
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        said = process.stdout.readline().split()
        assert said[:1] == ["ready"], f"the stand-in did not start: {said}"
        yield StandIn(process, int(said[1]), int(said[2]), int(said[3]), int(said[4]))
    finally:
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)


@contextlib.contextmanager
def racing(racer: int, looker: int, micros: int = 2000) -> Iterator[None]:
    """While it lasts, root's look helper `looker` waits `micros` before each take (strace's fault injection delays
    its pidfd_getfd at entry) and process `racer` runs at the highest weight: a racer swapping its descriptor every
    fraction of a millisecond then runs, and swaps, between the kernel's word and the take, where it had to in the very
    microseconds between them. Beside six busy loops, a racer left to the scheduler needed up to 1,855 looks (a CI
    run lost two races in 2,000); raced so, a median of 10 and at most 222 over 100 races. The look's code is root's
    own throughout; only its pace is changed. The racer gets back its ordinary weight after."""
    argv = ["strace", "-qq", "-o", "/dev/null", "-p", str(looker), "-e", "trace=pidfd_getfd"]
    argv += ["-e", f"inject=pidfd_getfd:delay_enter={micros}"]
    tracer = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: tracer_of(looker) == tracer.pid or tracer.poll() is not None, STOP_TIMEOUT, "strace to attach")
        assert tracer.poll() is None, f"strace did not attach to the look helper: {tracer.communicate()[1]}"
        os.setpriority(os.PRIO_PROCESS, racer, -20)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, racer, 0)
        tracer.terminate()  # (it detaches: the helper goes on at its own pace)
        tracer.wait(STOP_TIMEOUT)


def tracer_of(pid: int) -> int | None:
    """The pid of the process tracing process `pid` (0: none), or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("TracerPid:"))


def state_of(pid: int) -> str | None:
    """A process's state letter (R, S, D, Z...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def ended(pid: int) -> None:
    wait_for(lambda: state_of(pid) in (None, "Z"), STOP_TIMEOUT, f"process {pid} to end")


def own_children() -> set[int]:
    """The pids of this process's children now."""
    me = os.getpid()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                    found.add(int(entry.name))
    return found
