"""The review on a real VM: three-way merges, the mass-change guard and the secret scans, both ways.

The tests share one kept session but not their files: each works in its own directory and pulls only its own
paths, so any one of them runs alone (`-k`) or in any order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vmsandbox.session.record import Record

from .conftest import Cli, VmFactory, guest_sh

LINES = "".join(f"line {i}\n" for i in range(1, 21))


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("review") / "project"
    (p / "merge").mkdir(parents=True)
    for name in ("apart.txt", "overlap.txt", "gone.txt"):
        (p / "merge" / name).write_text(LINES)
    return p


@pytest.fixture(scope="module")
def session(module_vms: VmFactory, project: Path) -> Record:
    return module_vms.make(project)


def test_edits_that_do_not_overlap_are_merged_and_overlapping_ones_kept(
    cli: Cli, session: Record, project: Path
) -> None:
    guest_sh(
        session,
        "cd merge && sed -i 's/^line 3$/guest 3/' apart.txt overlap.txt gone.txt && "
        "sed -i 's/^line 18$/guest 18/' overlap.txt",
    )
    # the host edits the same files meanwhile: apart.txt far from the guest's edit, overlap.txt on the same line
    (project / "merge" / "apart.txt").write_text(LINES.replace("line 15\n", "host 15\n"))
    (project / "merge" / "overlap.txt").write_text(LINES.replace("line 3\n", "host 3\n"))
    (project / "merge" / "gone.txt").unlink()  # deleted on the host, edited in the guest: no merge to make

    shown = cli.run("pull", session.name, "merge", "--dry-run")
    assert shown.returncode == 0, shown.stderr.decode()
    table = shown.stderr.decode()
    assert "merged" in table
    assert "1 overlapping hunk(s), the rest merged" in table

    done = cli.run("pull", session.name, "merge", "--yes")
    assert done.returncode == 0, done.stderr.decode()  # every change dealt with: the conflicts kept beside
    merged = LINES.replace("line 3\n", "guest 3\n").replace("line 15\n", "host 15\n")
    assert (project / "merge" / "apart.txt").read_text() == merged
    # the overlapping edit: the host's file as the host left it, the guest's whole version beside it
    assert (project / "merge" / "overlap.txt").read_text() == LINES.replace("line 3\n", "host 3\n")
    beside = project / "merge" / f"overlap.txt.vmsandbox-{session.name}"
    assert beside.read_text() == LINES.replace("line 3\n", "guest 3\n").replace("line 18\n", "guest 18\n")
    assert not (project / "merge" / "gone.txt").exists()
    assert (project / "merge" / f"gone.txt.vmsandbox-{session.name}").read_text() == LINES.replace(
        "line 3\n", "guest 3\n"
    )
    assert "merged" in done.stderr.decode()
