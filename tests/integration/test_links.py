"""A guest's links against real pulls (issue 57): whatever order the guest makes them in, in one pull or across
several, and whatever a person takes (`--include-risky`: everything but what can never be written), nothing lands
in the project that resolves outside it. The judge reads the tree as it will be: a link through a component
nobody has waits for a person, and a change that would make a link already on the host lead out is refused. On
a file system that folds case, `x` is `X`: the folding variants run on a casefold ext4 the test makes where the
kernel mounts one, and with the project's answer to "does it fold" stood in for where it cannot (this machine's
kernel has no CONFIG_UNICODE)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox.confine import beneath
from vmsandbox.core import reviews
from vmsandbox.core.person import Nobody
from vmsandbox.session.record import Record
from vmsandbox.sync.review.take import Take

from .conftest import Cli, VmFactory, guest_sh

DEEP = "p/q/r/s/t/u/v/w"  # eight levels: L's `..`s climb exactly to the project's top through x
LEAK = "x/../../../../../../../../../etc/passwd"
UP = "../../../../../../../.."  # from DEEP: the project's top
EVERYTHING = ("--yes", "--include-risky")  # a person who takes all that can be taken


def make_project(where: Path) -> Path:
    where.mkdir(exist_ok=True)
    (where / "README").write_text("links\n")
    for top in ("p", "a"):
        (where / DEEP.replace("p", top, 1)).mkdir(parents=True)
    return where


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("links") / "project")


@pytest.fixture(scope="module")
def name(kept_session: str) -> str:
    return kept_session


def resolved_outside(project: Path) -> list[str]:
    """Every link in the project that the kernel resolves to a place outside it (each followed as the host's
    tools would: an editor, `cp -L`, a build writing into it)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(project):
        for entry in dirnames + filenames:
            path = Path(dirpath) / entry
            if not path.is_symlink():
                continue
            try:
                fd = os.open(path, os.O_PATH)
            except OSError:
                continue  # resolves nowhere today
            try:
                real = Path(f"/proc/self/fd/{fd}").readlink()
            finally:
                os.close(fd)
            if real != project and project not in real.parents:
                found.append(f"{path.relative_to(project)} -> {real}")
    return found


def pull(cli: Cli, name: str, *flags: str) -> subprocess.CompletedProcess[str]:
    done = cli.run("pull", name, *flags)
    assert done.returncode in (0, 3), done.stderr.decode()  # 3: changes remain (held, or refused)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def test_two_pulls_each_taken_land_no_link_that_leads_out(cli: Cli, name: str, project: Path) -> None:
    record = Record.load(name)
    guest_sh(record, f"ln -s {LEAK} {DEEP}/L")
    first = pull(cli, name, "--yes")
    assert not (project / DEEP / "L").is_symlink()  # held: x is nobody's, where L leads is not known
    assert "which neither the project nor the guest has" in first.stdout + first.stderr
    pull(cli, name, *EVERYTHING)  # a person takes it anyway: today it leads nowhere
    assert (project / DEEP / "L").readlink() == Path(LEAK)

    guest_sh(record, f"ln -s {UP} {DEEP}/x")  # alone, x points at the project's top
    second = pull(cli, name, *EVERYTHING)
    assert not (project / DEEP / "x").is_symlink()
    assert f"the link {DEEP}/L -> {LEAK!r} already in the project leads out" in second.stdout + second.stderr
    assert resolved_outside(project) == []
    assert not (project / DEEP / "L").exists()  # L still leads nowhere, not to /etc/passwd


def test_the_other_order_refuses_the_link_that_would_lead_out(cli: Cli, name: str, project: Path) -> None:
    record = Record.load(name)
    deep = DEEP.replace("p", "a", 1)
    guest_sh(record, f"ln -s {UP} {deep}/x")
    pull(cli, name, *EVERYTHING)
    assert (project / deep / "x").readlink() == Path(UP)  # x alone: the project's top, inside
    guest_sh(record, f"ln -s {LEAK} {deep}/L")
    later = pull(cli, name, *EVERYTHING)
    assert not (project / deep / "L").is_symlink()
    assert f"symlink to {LEAK!r} leaves the project" in later.stdout + later.stderr
    assert resolved_outside(project) == []


# ---------------------------------------------------------------------- where names fold


@contextlib.contextmanager
def casefold_ext4(where: Path) -> Iterator[Path]:
    """A casefold ext4 image mounted at `where`, holding `project/` with the casefold flag (ext4 sets it on
    empty directories: new ones under it inherit it)."""
    image = where.parent / f"{where.name}.img"
    subprocess.run(["truncate", "-s", "64M", image], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-O", "casefold", image], check=True)
    where.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop", image, where], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        image.unlink()
        # A kernel's build, not a package CI could install: skipped (the folding stand-in below runs everywhere).
        pytest.skip(f"this kernel mounts no casefold ext4 ({mounted.stderr.strip()}; it needs CONFIG_UNICODE)")
    try:
        (where / "project").mkdir()
        subprocess.run(["chattr", "+F", where / "project"], check=True)
        yield where / "project"
    finally:
        subprocess.run(["umount", where], check=False)
        image.unlink()


@pytest.mark.root("it mounts a file system")
def test_on_a_casefold_ext4_one_pull_is_refused(vm_factory: VmFactory, tmp_path: Path, cli: Cli) -> None:
    with casefold_ext4(tmp_path / "mnt") as project:
        make_project(project)
        with beneath.Root.open(project) as top:
            assert top.folds()
        record = vm_factory.make(project)
        guest_sh(record, f"ln -s {UP} {DEEP}/X && ln -s {LEAK} {DEEP}/L")  # two names in the guest, one here
        done = pull(cli, record.name, *EVERYTHING)
        assert not (project / DEEP / "L").is_symlink(), done.stderr
        assert f"symlink to {LEAK!r} leaves the project" in done.stdout + done.stderr
        assert resolved_outside(project) == []


def test_where_names_fold_one_pull_is_refused(
    vm_factory: VmFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folding stand-in: the project's file system says it folds (as ext4's casefold flag, CIFS or a Mac's
    volume would); the rest is real — the guest, the mirror, the review, the apply."""
    project = make_project(tmp_path / "project")
    record = vm_factory.make(project)
    guest_sh(record, f"ln -s {UP} {DEEP}/X && ln -s {LEAK} {DEEP}/L")
    asked: list[Path] = []

    def folds(root: beneath.Root) -> bool:
        asked.append(root.path)
        return True

    monkeypatch.setattr(beneath.Root, "folds", folds)
    settled = reviews.pull(record.name, Nobody(yes=True, take=Take(risky=True)))
    assert asked == [project]
    assert not (project / DEEP / "L").is_symlink()
    assert (project / DEEP / "X").is_symlink()  # X alone leads to the top: it lands
    refused = [line for line in settled.outcome.refused if f"{DEEP}/L" in line]
    assert refused and "leaves the project" in refused[0]
    shutil.rmtree(project / "p")  # (this machine does not fold: nothing to resolve outside either way)
