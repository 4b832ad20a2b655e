"""The guest's side of a sandbox's processes (sandbox/processes.py sends this file to the guest's python3 over
the session's ssh, as root, at every call: nothing of it is installed in the image).

A process started here outlives the ssh call that started it, every client that watched it and a stop/start
of its VM (its runner is a guest process like any other, saved and restored with its memory). Each lives in
/run/vmsandbox/procs/PID/ (PID: the process's own): its spec, its output as one log of framed records in the
order the runner read them (a byte for the stream — 1 stdout, 2 stderr, 0 the exit as JSON — four bytes of
length, the data), its stdin as a FIFO the runner keeps open until told to close it, and its exit.

    python3 supervisor.py start            (the spec as JSON on stdin) -> prints the pid
    python3 supervisor.py follow PID FROM [MOST]  -> the log's records from byte FROM, as they come, then the exit
                                           (MOST: only the whole records of MOST bytes there are now; exit 4:
                                           no such process)
    python3 supervisor.py list             -> the running processes, as JSON
    python3 supervisor.py input PID        (bytes on stdin: to the process's stdin)
    python3 supervisor.py close PID        -> its stdin closed
    python3 supervisor.py signal PID SIG   -> its process group signalled

A sandbox's files have a guest side of their own (guestfiles.py). This file imports nothing of vmsandbox: it
runs in the guest.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import selectors
import signal
import struct
import sys
import time
from typing import Any

ROOT = "/run/vmsandbox/procs"
STEP = "/usr/local/lib/vmsandbox/step"  # the journal's step wrapper (journal.c, provenance.c)
HEAD = struct.Struct(">BI")
OUT, ERR, EXIT = 1, 2, 0
POLL = 0.05
CHUNK = 64 * 1024


def _dir(pid: int) -> str:
    return os.path.join(ROOT, str(int(pid)))


def _child(spec: dict[str, Any], stdin_fd: int, out_w: int, err_w: int) -> None:
    """In the forked child: its own session and group, the user, the environment; then exec."""
    os.setsid()
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    user = pwd.getpwnam(spec["user"])
    env = {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": user.pw_shell,
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    env.update(spec.get("envs") or {})
    os.setgid(user.pw_gid)
    os.initgroups(user.pw_name, user.pw_gid)
    os.setuid(user.pw_uid)
    os.chdir(spec.get("cwd") or user.pw_dir)
    argv = [spec["cmd"], *spec.get("args", [])]
    step = spec.get("step")
    if isinstance(step, str) and step.isalnum() and step.isascii() and os.access(STEP, os.X_OK):
        argv = [STEP, step, "--", *argv]  # registered as the root of its step (the journal's provenance)
    os.execvpe(argv[0], argv, env)


def _run(new: str, spec: dict[str, Any]) -> None:
    """The runner (a daemon of its own): starts the process, writes what it says into the log, and its exit."""
    dir_fd = os.open(new, os.O_RDONLY | os.O_DIRECTORY)
    fifo = os.path.join(new, "stdin")
    os.mkfifo(fifo, 0o600)
    anchor = os.open(fifo, os.O_RDWR)  # the FIFO's writer while stdin is open: closed, the process reads EOF
    stdin_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK) if spec.get("stdin") else os.open(os.devnull, os.O_RDONLY)
    os.set_blocking(stdin_fd, True)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _child(spec, stdin_fd, out_w, err_w)
        except BaseException as exc:  # noqa: BLE001 - it could not run: said on its stderr
            os.write(2, f"{spec['cmd']}: {exc}\n".encode())
        os._exit(127)
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    if not spec.get("stdin"):
        os.close(anchor)
        anchor = -1
    log = os.open("log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600, dir_fd=dir_fd)
    with open(os.open("runner", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=dir_fd), "w") as f:
        f.write(str(os.getpid()))
    with open(os.open("pid", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=dir_fd), "w") as f:
        f.write(str(pid))
    signal.signal(signal.SIGUSR1, lambda *_: _close_anchor())
    _state["anchor"] = anchor
    deadline = time.monotonic() + spec["timeout"] if spec.get("timeout") else None
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, OUT)
    sel.register(err_r, selectors.EVENT_READ, ERR)
    while sel.get_map():
        for key, _ in sel.select(timeout=0.5):
            data = os.read(key.fd, CHUNK)
            if not data:
                sel.unregister(key.fd)
                os.close(key.fd)
                continue
            os.write(log, HEAD.pack(key.data, len(data)) + data)
        if deadline is not None and time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = None
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    said = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name.lower()[3:]}"
    ended = json.dumps({"code": code if code >= 0 else -1, "status": said}).encode()
    os.write(log, HEAD.pack(EXIT, len(ended)) + ended)
    with open(os.open("exit", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=dir_fd), "w") as f:
        f.write(ended.decode())


_state: dict[str, int] = {"anchor": -1}


def _close_anchor() -> None:
    if _state["anchor"] >= 0:
        os.close(_state["anchor"])
        _state["anchor"] = -1


def start() -> None:
    spec = json.load(sys.stdin)
    os.makedirs(ROOT, mode=0o700, exist_ok=True)
    new = os.path.join(ROOT, f".new-{os.getpid()}")
    os.mkdir(new, 0o700)
    with open(os.path.join(new, "spec.json"), "w") as f:
        json.dump(spec, f)
    if os.fork() == 0:  # the runner: a daemon of its own, which no ssh session's end reaches
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            _run(new, spec)
        finally:
            os._exit(0)
    pid_file = os.path.join(new, "pid")
    for _ in range(600):
        if os.path.exists(pid_file) and os.path.getsize(pid_file):
            break
        time.sleep(POLL)
    with open(pid_file) as f:
        pid = int(f.read())
    os.rename(new, _dir(pid))
    print(pid)


MISSING = 4  # `follow`'s exit code when there is no such process


def follow(pid: int, offset: int, most: int | None = None) -> None:
    """The log's records from `offset` as they come, until the exit; with `most`, only the whole records of the
    first `most` bytes there are now (at least one), then end."""
    where = _dir(pid)
    try:
        log = open(os.path.join(where, "log"), "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        sys.exit(MISSING)
    out = sys.stdout.buffer
    with log:
        log.seek(offset)
        if most is not None:
            _some(log, out, most)
            return
        while True:
            data = log.read(CHUNK)
            if data:
                out.write(data)
                out.flush()
                continue
            if os.path.exists(os.path.join(where, "exit")):
                rest = log.read()
                if not rest:
                    return
                out.write(rest)
                out.flush()
                continue
            time.sleep(POLL)


def _some(log: Any, out: Any, most: int) -> None:
    sent = 0
    while len(head := log.read(HEAD.size)) == HEAD.size:
        _, length = HEAD.unpack(head)
        data = log.read(length)
        if len(data) < length or (sent and sent + HEAD.size + length > most):
            break
        out.write(head + data)
        sent += HEAD.size + length
    out.flush()


def running() -> None:
    found = []
    for name in os.listdir(ROOT) if os.path.isdir(ROOT) else []:
        where = os.path.join(ROOT, name)
        if name.isdigit() and not os.path.exists(os.path.join(where, "exit")):
            with open(os.path.join(where, "spec.json")) as f:
                found.append({"pid": int(name), "spec": json.load(f)})
    print(json.dumps(found))


def main(argv: list[str]) -> None:
    verb = argv[0]
    if verb == "start":
        start()
    elif verb == "follow":
        follow(int(argv[1]), int(argv[2]), int(argv[3]) if len(argv) > 3 else None)
    elif verb == "list":
        running()
    elif verb == "input":
        with open(os.path.join(_dir(int(argv[1])), "stdin"), "wb") as fifo:
            while data := sys.stdin.buffer.read(CHUNK):
                fifo.write(data)
    elif verb == "close":
        with open(os.path.join(_dir(int(argv[1])), "runner")) as f:
            os.kill(int(f.read()), signal.SIGUSR1)
    elif verb == "signal":
        os.killpg(int(argv[1]), int(argv[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
