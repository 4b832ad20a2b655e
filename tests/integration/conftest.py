"""Integration tests boot real VMs under libvirt.

Layers: host (libvirt reachable, root) -> base image (built once, cached by recipe hash in the data dir)
-> a shared booted session for tests that don't disturb it -> fresh sessions for tests that own a VM.
Every session gets a unique name; teardown removes every domain and directory a test made; a failed
test keeps the session's serial console log (path printed).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vmsandbox import paths, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import build, store
from vmsandbox.session import boot, create, lifecycle
from vmsandbox.session.config import Settings
from vmsandbox.session.options import Options
from vmsandbox.session.record import DOMAIN_PREFIX, Record
from vmsandbox.vm.domain import session_of
from vmsandbox.vm.virt import Hypervisor

URI = os.environ.get("VMSANDBOX_LIBVIRT_URI", "qemu:///system")
LOG_KEEP_DIR = Path(os.environ.get("VMSANDBOX_TEST_LOGS", "/var/tmp/vmsandbox-test-logs"))
NAME_PREFIX = "it-"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.when == "call":  # type: ignore[attr-defined]
        item.stash[FAILED] = report.failed  # type: ignore[attr-defined]
    return report


FAILED = pytest.StashKey[bool]()


def _unavailable(reason: str) -> None:
    """In CI a missing prerequisite is a failure, never a silent skip."""
    if os.environ.get("CI"):
        pytest.fail(f"integration prerequisites missing in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def host() -> str:
    if os.geteuid() != 0:
        _unavailable("integration tests need root (qemu:///system, image build)")
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
    with Hypervisor(URI) as hv:  # only this run's domains: another run may share the host
        for info in list(hv.domains(DOMAIN_PREFIX + NAME_PREFIX)):
            xml = hv.xml(info.name)
            owner = session_of(xml) if xml else None
            if owner is not None and d in owner[1].parents:
                hv.destroy(info.name)
    _keep_failed_boots(d)
    if old is None:
        del os.environ["VMSANDBOX_STATE_DIR"]
    else:
        os.environ["VMSANDBOX_STATE_DIR"] = old
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
            terminalreporter.write_line("    " + ui.printable(boot.plain(line), markup=False))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "my project"
    p.mkdir()
    (p / "README").write_text("hello\n")
    return p


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


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
        return [sys.executable, "-m", "vmsandbox", *args]

    def run(
        self,
        *args: str,
        input: bytes | None = None,
        timeout: float = 600,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            self.argv(*args), input=input, capture_output=True, timeout=timeout, env=env or self.env(), check=False
        )

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
        data: list[dict[str, object]] = json.loads(result.stdout)
        return data


@pytest.fixture(scope="session")
def cli(state_dir: Path) -> Cli:
    return Cli(state_dir)


def keep_console_on_failure(request: pytest.FixtureRequest, name: str) -> None:
    if request.node.stash.get(FAILED, False):
        log_file = paths.session_paths(name).console_log
        if log_file.exists():
            LOG_KEEP_DIR.mkdir(parents=True, exist_ok=True)
            kept = LOG_KEEP_DIR / f"{request.node.name}-{name}.console.log"
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
            if hv.info(DOMAIN_PREFIX + name) is not None:
                found.append("domain")
        if paths.session_paths(name).root.exists():
            found.append("session directory")
        ps = processes()
        if f"guest=vmsandbox-{name}," in ps:
            found.append("QEMU process")
        if f"vmsandbox.egress.daemon {name}" in ps:
            found.append("egress daemon")  # the session's proxy daemon goes with it
        if f"vmsandbox.session.teardown {name}" in ps:
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
        hv.destroy(DOMAIN_PREFIX + name)
    shutil.rmtree(paths.session_paths(name).root, ignore_errors=True)


@pytest.fixture(scope="module")
def kept_session(cli: Cli, project: Path, base_image: store.Image) -> Iterator[str]:
    """A session started with `run --keep` on the module's own (module-scoped) `project`, for a module whose
    tests run in order against it; destroyed, whatever it holds, when the module is done."""
    n = unique_name()
    r = cli.run("run", "--keep", "--name", n, str(project), "--", "true")
    assert r.returncode == 0, r.stderr.decode()
    yield n
    cli.run("destroy", n, "--discard")


@pytest.fixture(scope="session")
def shared(base_image: store.Image, state_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Record]:
    """One booted session shared by tests that only read from it."""
    proj = tmp_path_factory.mktemp("shared") / "shared project"
    proj.mkdir()
    record = create.create(Options(project=proj, name=unique_name(), settings=Settings(), keep=True))
    yield record
    lifecycle.remove(record)
