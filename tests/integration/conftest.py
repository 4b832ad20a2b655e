"""Integration tests boot real VMs under libvirt.

Layers: host (libvirt reachable, root) -> base image (built once, cached by recipe hash in the data dir)
-> a shared booted session for tests that don't disturb it -> fresh sessions for tests that own a VM.
Every session gets a unique name; teardown removes every domain and directory a test made; a failed
test keeps the session's serial console log (path printed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import resource
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from vmsandbox import paths, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import build, store
from vmsandbox.session.end import lifecycle
from vmsandbox.session.options import Options
from vmsandbox.session.place import console
from vmsandbox.session.record import Record, domain_name
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create
from vmsandbox.sync.fetch import volume
from vmsandbox.vm.domain import session_of
from vmsandbox.vm.virt import Hypervisor

URI = os.environ.get("VMSANDBOX_LIBVIRT_URI", "qemu:///system")
# The suite's guests get one vCPU (the CLI through VMSANDBOX_CPUS, the Python API through suite_settings()): under
# TCG on a 2-core host that runs two workers' guests, a second vCPU only adds contention (here a 1-vCPU guest ran
# a fork-exec loop, a Python loop and 50 git commits 10-15 % faster). The product's default stays 2.
TEST_CPUS = int(os.environ.setdefault("VMSANDBOX_CPUS", "1"))


SUDO_PLAYED = ("alice", 1234, 2345)  # the invoking user tests play, as `sudo` by them would report


def played_user() -> tuple[str, int, int]:
    """Who the guest user is in sessions the tests make as `sudo` by alice (SUDO_USER=alice, 1234:2345): alice as
    root; as a plain user, that user (sudo's variables are believed only under sudo, that is as root)."""
    if os.geteuid() == 0:
        return SUDO_PLAYED
    me = pwd.getpwuid(os.geteuid())
    return (me.pw_name, me.pw_uid, me.pw_gid)


def suite_settings() -> Settings:
    """The settings the suite's sessions are made with through the Python API (the CLI's defaults, as here)."""
    return replace(Settings(), cpus=TEST_CPUS)


LOG_KEEP_DIR = Path(os.environ.get("VMSANDBOX_TEST_LOGS", "/var/tmp/vmsandbox-test-logs"))
NAME_PREFIX = "it-"


# The modules that cost the most, first: the workers (pytest-xdist `--dist loadfile`: a module's tests all run on
# one worker, in order, so its shared VMs are made once) take a module at a time in this order, so the long ones
# start at once and the short ones fill in at the end. The module of exclusive tests goes last.
# (Not `--dist loadgroup`: with pytest 9.2 xdist 3.8's group marks no longer reach its scheduler, so modules were
# split across workers and each made its module's VMs again.)
HEAVIEST_FIRST = (  # by the wall time of each module's tests in a run (bench/suite.py prints them)
    "test_hosts.py",
    "test_faults.py",
    "test_egress.py",
    "test_hostile_guest.py",
    "test_experiments.py",
    "test_lifecycle.py",
    "test_blueprints.py",
    "test_warm.py",
    "test_image_build.py",
    "test_journal.py",
    "test_workspace.py",
    "test_plain_user.py",
    "test_shared_session.py",
    "test_proxy.py",
    "test_jail.py",
)
EXCLUSIVE_LAST = "test_libvirtd_restart.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration tests are marked as such and ordered heaviest module first, the exclusive module last."""
    here = Path(__file__).parent
    mine = [item for item in items if here in Path(str(item.fspath)).parents]
    for item in mine:
        item.add_marker(pytest.mark.integration)
        exclusive = item.get_closest_marker("exclusive") is not None
        if exclusive != (Path(str(item.fspath)).name == EXCLUSIVE_LAST):
            raise pytest.UsageError(f"{item.nodeid}: exclusive tests belong in {EXCLUSIVE_LAST}, and only they")

    def weight(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        if name == EXCLUSIVE_LAST:
            return len(HEAVIEST_FIRST) + 1
        return HEAVIEST_FIRST.index(name) if name in HEAVIEST_FIRST else len(HEAVIEST_FIRST)

    order = {id(item): n for n, item in enumerate(items)}
    mine.sort(key=lambda item: (weight(item), order[id(item)]))
    slots = iter(mine)
    items[:] = [next(slots) if here in Path(str(item.fspath)).parents else item for item in items]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.when == "call":  # type: ignore[attr-defined]
        item.stash[FAILED] = report.failed  # type: ignore[attr-defined]
    return report


FAILED = pytest.StashKey[bool]()

# Tests run in parallel (pytest-xdist: one process per worker, each with its own state directory). A test marked
# `exclusive` takes the host itself away for a moment (stops libvirtd, kills a shared build): it runs while no
# other integration test of any worker runs. The lock covers each test's whole protocol, fixtures included.
HOST_LOCKS = Path(os.environ.get("VMSANDBOX_TEST_LOCKS", "/var/tmp/vmsandbox-it-locks"))


@contextlib.contextmanager
def host_lock(*, exclusive: bool) -> Iterator[None]:
    """A readers-writer lock over the host, writer-preferring: a waiting exclusive test holds the turnstile,
    so no new test starts until the running ones are done and it has run."""
    HOST_LOCKS.mkdir(mode=0o700, exist_ok=True)
    turnstile = os.open(HOST_LOCKS / "turnstile", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    host = os.open(HOST_LOCKS / "host", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(host, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        os.close(host)
        os.close(turnstile)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `root` (it makes accounts, stops libvirtd, builds images, plays a remote host) is skipped with
    its reason when the suite runs as a plain user."""
    mark = item.get_closest_marker("root")
    if mark is not None and os.geteuid() != 0:
        pytest.skip(f"needs root: {mark.args[0] if mark.args else 'it changes the host'}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if item.get_closest_marker("integration") is None:
        return (yield)
    with host_lock(exclusive=item.get_closest_marker("exclusive") is not None), _costed(item):
        return (yield)


CLI_CALLS = [0]  # `vmsandbox` commands this worker has started
COST_LOG = os.environ.get("VMSANDBOX_TEST_COST_LOG")  # bench/suite.py: what each test cost the host


@contextlib.contextmanager
def _costed(item: pytest.Item) -> Iterator[None]:
    """With VMSANDBOX_TEST_COST_LOG set: a JSON line per test with when it started, on which worker, its wall
    time and the CPU time the whole host spent meanwhile (the CPU only means the test's own when tests run one
    at a time: `bench/suite.py --serial`; in parallel the lines show when a worker sat idle)."""
    if not COST_LOG:
        yield
        return
    began, started, busy = time.time(), time.monotonic(), _host_busy_seconds()
    calls, children = CLI_CALLS[0], _children_seconds()
    try:
        yield
    finally:
        line = {
            "test": item.nodeid,
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "start": round(began, 2),
            "wall": round(time.monotonic() - started, 2),
            "cpu": round(_host_busy_seconds() - busy, 2),
            "cli_calls": CLI_CALLS[0] - calls,
            "children_cpu": round(_children_seconds() - children, 2),
        }
        with Path(COST_LOG).open("a") as log:
            log.write(json.dumps(line) + "\n")


def _children_seconds() -> float:
    """CPU seconds of this worker's waited-for children so far: the `vmsandbox` commands it ran (with the ssh and
    rsync they waited for), not the daemons they left running or the guests."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _host_busy_seconds() -> float:
    """CPU seconds the host spent on anything but idling and waiting for I/O since it booted (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def libvirtd_pid() -> int:
    """This host's libvirtd (not a stand-in host's, which runs in a mount namespace of its own)."""
    pid = int(Path("/run/libvirtd.pid").read_text().strip())
    assert Path(f"/proc/{pid}").exists(), f"libvirtd (pid {pid}) is not running"
    return pid


def stop_libvirtd() -> None:
    """Stop this host's libvirtd (the caller brings it back with `vmsandbox host setup`)."""
    pid = libvirtd_pid()
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 60, "libvirtd to stop")


def _unavailable(reason: str) -> None:
    """In CI a missing prerequisite is a failure, never a silent skip."""
    if os.environ.get("CI"):
        pytest.fail(f"integration prerequisites missing in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def host() -> str:
    """libvirt answering: as root, or as a plain member of the libvirt group (the suite runs either way; a test
    that needs root for what it does carries `@pytest.mark.root`)."""
    try:
        with Hypervisor(URI):
            pass
    except VmsandboxError as exc:  # the same probe `vmsandbox doctor` uses
        _unavailable(f"{exc.message} ({exc.hint})")
    return URI


@pytest.fixture(scope="session")
def base_image(host: str) -> store.Image:
    built, _ = build.build()  # a no-op when this recipe is already built (the CI cache)
    return built


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    """A private state dir for the run; libvirt's QEMU user must be able to traverse it."""
    d = Path(tempfile.mkdtemp(prefix="vmsandbox-it-", dir="/var/tmp"))
    d.chmod(0o711)
    old = os.environ.get("VMSANDBOX_STATE_DIR")
    os.environ["VMSANDBOX_STATE_DIR"] = str(d)
    yield d
    with Hypervisor(URI) as hv:  # only this run's domains (another run may share the host), whatever their name:
        for info in list(hv.domains(domain_name(""))):  # a session named after its project, a reader VM too
            xml = hv.xml(info.name)
            owner = session_of(xml) if xml else None
            if owner is not None and d in owner[1].parents:
                hv.destroy(info.name)
    _keep_failed_boots(d)
    if old is None:
        del os.environ["VMSANDBOX_STATE_DIR"]
    else:
        os.environ["VMSANDBOX_STATE_DIR"] = old
    for left in (d / "sessions").glob("*"):  # a session the run left: its mirror's file system unmounted first
        with contextlib.suppress(VmsandboxError, OSError):
            volume.drop(paths.SessionPaths(left))
    shutil.rmtree(d, ignore_errors=True)


def _keep_failed_boots(state: Path) -> None:
    """The consoles the product kept of boots that failed (failed-boots/ in the state dir, which this run
    deletes) go where CI prints them: LOG_KEEP_DIR, listed at the end of the run."""
    for log_file in sorted((state / "failed-boots").glob("*.console.log")):
        LOG_KEEP_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log_file, LOG_KEEP_DIR / log_file.name)
        KEPT.append(LOG_KEEP_DIR / log_file.name)


KEPT: list[Path] = []
KEPT_TAIL_LINES = 25


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Every serial console kept during the run, with its last lines: a failed boot explains itself in CI's
    own output, even when the machine is gone."""
    if not KEPT:
        return
    terminalreporter.section("serial consoles kept")
    for kept in KEPT:
        lines = kept.read_text(errors="replace").splitlines()[-KEPT_TAIL_LINES:]
        terminalreporter.write_line(f"{kept} (last {len(lines)} lines):")
        for line in lines:
            terminalreporter.write_line("    " + ui.printable(console.plain(line), markup=False))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "my project"
    p.mkdir()
    (p / "README").write_text("hello\n")
    return p


def wait_for(predicate: Callable[[], object], timeout: float, what: str, *, every: float = 0.2) -> None:
    """Poll predicate until it holds. A predicate that runs a `vmsandbox` command (half a CPU-second each, on a
    host whose CPUs the guests need) polls `every=CLI_POLL` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


CLI_POLL = 2.0


def unique_name() -> str:
    return f"{NAME_PREFIX}{secrets.token_hex(3)}"


def default_signals() -> None:
    """In a child the tests signal: SIGINT as a terminal would deliver it. A suite started in the background
    by a shell without job control (`cmd &` in a script) inherits SIGINT ignored, and Python then never turns
    it into KeyboardInterrupt: the Ctrl-C tests would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Cli:
    state_dir: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["VMSANDBOX_STATE_DIR"] = str(self.state_dir)
        env.update(extra)
        return env

    def argv(self, *args: str) -> list[str]:
        CLI_CALLS[0] += 1
        return [sys.executable, "-m", "vmsandbox", *args]

    def run(
        self,
        *args: str,
        input: bytes | None = None,
        timeout: float = 600,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        started = time.monotonic()
        done = subprocess.run(
            self.argv(*args), input=input, capture_output=True, timeout=timeout, env=env or self.env(), check=False
        )
        if COST_LOG:  # each command's wall time: bench/suite.py keeps them in <data dir>/suite-last-calls.jsonl
            call = {"args": [a for a in args if "/" not in a][:4], "wall": round(time.monotonic() - started, 2)}
            with Path(COST_LOG + ".calls").open("a") as log:
                log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "?"), **call}) + "\n")
        return done

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env or self.env(),
            preexec_fn=default_signals,  # noqa: PLW1509 - signal dispositions only
        )

    def ls(self) -> list[dict[str, object]]:
        result = self.run("ls", "--json")
        assert result.returncode == 0, result.stderr.decode()
        return [json.loads(line) for line in result.stdout.splitlines()]  # an object a line


@pytest.fixture(scope="session")
def cli(state_dir: Path) -> Cli:
    return Cli(state_dir)


def keep_console_on_failure(request: pytest.FixtureRequest, name: str) -> None:
    keep_console(request.node.name, name, failed=request.node.stash.get(FAILED, False))


def keep_console(test: str, name: str, *, failed: bool) -> None:
    """After a failed test, the serial console of its session `name` goes where CI lists it."""
    log_file = paths.session_paths(name).console_log
    if failed and log_file.exists():
        LOG_KEEP_DIR.mkdir(parents=True, exist_ok=True)
        kept = LOG_KEEP_DIR / f"{test}-{name}.console.log"
        shutil.copyfile(log_file, kept)
        KEPT.append(kept)
        print(f"\nserial console of {name} kept at {kept}")


def processes() -> str:
    """The command lines of every process on the host, one per line."""
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout


def assert_gone(name: str, *, within: float = 60) -> None:
    """No domain, no session directory, no QEMU process for this session — once its background teardown
    (the end of `run`) is done, which may take `within` seconds."""

    def leftovers() -> list[str]:
        found = []
        with Hypervisor(URI) as hv:
            if hv.info(domain_name(name)) is not None:
                found.append("domain")
        if paths.session_paths(name).root.exists():
            found.append("session directory")
        ps = processes()
        if f"guest=vmsandbox-{name}," in ps:
            found.append("QEMU process")
        if f"vmsandbox.egress.daemon {name}" in ps:
            found.append("egress daemon")  # the session's proxy daemon goes with it
        if f"vmsandbox.session.end.teardown {name}" in ps:
            found.append("teardown process")
        return found

    deadline = time.monotonic() + within
    while (left := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"session {name} left behind: {', '.join(left)}"


@pytest.fixture
def owned_name(request: pytest.FixtureRequest, base_image: store.Image, state_dir: Path) -> Iterator[str]:
    """A unique session name for a test that creates (and should remove) its own VM."""
    name = unique_name()
    yield name
    keep_console_on_failure(request, name)
    with Hypervisor(URI) as hv:
        hv.destroy(domain_name(name))
    shutil.rmtree(paths.session_paths(name).root, ignore_errors=True)


@pytest.fixture(scope="module")
def kept_session(module_vms: VmFactory, project: Path) -> str:
    """A kept session on the module's own (module-scoped) `project`, for a module whose tests run in order
    against it; removed, whatever it holds, when the module is done."""
    record = module_vms.make(project)
    assert record.start == "warm"  # restored from the template, not booted
    return record.name


class VmFactory:
    """Sessions for tests that own a VM, in the spirit of firecracker's `microvm_factory`: made through the Python
    API (create.create: a restore of the warm-start template, ~4 s under TCG, unless `cold`), kept like a
    `run --keep` session, and removed with everything they made when the fixture's scope ends. A test about
    the `run` command itself (its exit code, its review, its end) keeps using the CLI."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.made: list[str] = []
        self._failed_before = request.session.testsfailed

    def make(
        self,
        project: Path,
        *,
        name: str | None = None,
        settings: Settings | None = None,
        cold: bool = False,
        user: tuple[str, int, int] | None = None,
    ) -> Record:
        """A running session on `project` (`user`: the invoking user it plays, as `SUDO_USER` would say)."""
        name = name or unique_name()
        self.made.append(name)
        sudo = {"SUDO_USER": user[0], "SUDO_UID": str(user[1]), "SUDO_GID": str(user[2])} if user else {}
        saved = {k: os.environ.get(k) for k in sudo}
        os.environ.update(sudo)
        try:
            record = create.create(
                Options(project=project, name=name, settings=settings or suite_settings(), keep=True, cold=cold)
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        record.owner_pid = record.owner_start = None  # like a `run --keep` that has ended: nobody's run holds it
        record.save()
        return record

    def cleanup(self) -> None:
        """Remove every session made here that the test left (a test that destroys its own is fine too)."""
        failed = self.request.session.testsfailed > self._failed_before
        for name in self.made:
            keep_console(self.request.node.name, name, failed=failed)
            with contextlib.suppress(VmsandboxError):
                lifecycle.remove(Record.load(name))
            with Hypervisor(URI) as hv:
                hv.destroy(domain_name(name))
            with contextlib.suppress(VmsandboxError, OSError):
                volume.drop(paths.session_paths(name))
            shutil.rmtree(paths.session_paths(name).root, ignore_errors=True)


def guest_sh(record: Record, script: str, *, root: bool = False, timeout: float = 180) -> str:
    """Run `script` with sh in the guest's project directory (as the session's user, or root); its stdout. A
    failure fails the test with the command's stderr."""
    # `sh -c`: the script's own `&` and `;` stay inside it (a bare `cd X && a & b` would background the cd too,
    # and that subshell would hold the session's stdout open)
    command = f"cd {shlex.quote(record.project)} && exec sh -c {shlex.quote(script)}"
    argv = record.endpoint().ssh_argv("-T", user="root" if root else None)
    r = subprocess.run([*argv, "--", command], capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, f"{script}: exit {r.returncode}: {r.stderr}"
    return r.stdout


@pytest.fixture
def vm_factory(request: pytest.FixtureRequest, base_image: store.Image, state_dir: Path) -> Iterator[VmFactory]:
    factory = VmFactory(request)
    yield factory
    factory.cleanup()


@pytest.fixture(scope="module")
def module_vms(request: pytest.FixtureRequest, base_image: store.Image, state_dir: Path) -> Iterator[VmFactory]:
    """A factory whose sessions live as long as the module's tests (each must leave them usable for the next)."""
    factory = VmFactory(request)
    yield factory
    factory.cleanup()


@pytest.fixture(scope="session")
def shared(base_image: store.Image, state_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Record]:
    """One booted session shared by tests that only read from it."""
    proj = tmp_path_factory.mktemp("shared") / "shared project"
    proj.mkdir()
    record = create.create(Options(project=proj, name=unique_name(), settings=suite_settings(), keep=True))
    yield record
    lifecycle.remove(record)
