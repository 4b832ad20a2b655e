"""Review and sync-back: gather the guest's changes, show them, apply what is accepted, keep the rest.

Where guest changes come from, in order: the session's outbox (exported when its VM went away), the running
VM (rsync into the host mirror), or the workspace disk of a VM that died (read on the host).
What was applied or otherwise dealt with is recorded in review.json, so a change is reviewed once and an
interrupted pull can simply run again.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmsandbox import apply, paths, proc, tree, ui, workspace
from vmsandbox.errors import VmsandboxError
from vmsandbox.review import Change, Status, compare, is_git_managed, same_entry
from vmsandbox.session import Record, is_running
from vmsandbox.tree import DIR, FILE, SYMLINK

OUTBOX_MANIFEST = "manifest.json"
OUTBOX_FILES = "files"
OUTBOX_PATCH = "changes.patch"
BUNDLE = "git.bundle"
BINARY_SNIFF = 8192


@dataclass
class Gathered:
    record: Record
    changes: list[Change]  # the guest's changes against the baseline (SAME ones left out)
    source: Path  # where the guest's content is read from
    refs_changed: bool  # the guest moved branches or tags (commits come back through a bundle)
    origin: str  # live | disk | outbox

    @property
    def project(self) -> Path:
        return Path(self.record.project)


def _dealt(record: Record) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(record.files.review.read_text())
    except FileNotFoundError:
        return {}
    return data


def _mark(record: Record, changes: Iterable[Change]) -> None:
    dealt = _dealt(record)
    for c in changes:
        dealt[c.path] = c.guest.as_dict() if c.guest else None
    paths.write_atomically(record.files.review, json.dumps(dealt))


def pending(g: Gathered) -> list[Change]:
    """Changes nobody has dealt with yet. UNSAFE ones can never be applied: they are reported, not pending."""
    dealt = _dealt(g.record)
    out = []
    for c in g.changes:
        if c.status is Status.UNSAFE:
            continue
        if c.path in dealt and dealt[c.path] == (c.guest.as_dict() if c.guest else None):
            continue
        out.append(c)
    return out


def gather(record: Record) -> Gathered:
    files = record.files
    base = workspace.baseline(files)
    if files.outbox.is_dir():
        guest = dict(base)
        for path, entry in json.loads((files.outbox / OUTBOX_MANIFEST).read_text()).items():
            if entry is None:
                guest.pop(path, None)
            else:
                guest[path] = tree.Entry.from_dict(entry)
        source, origin = files.outbox / OUTBOX_FILES, "outbox"
    elif is_running(record):
        with ui.step("Fetching the guest's changes"):
            guest = workspace.fetch_live(record.endpoint(), record.project, files)
        source, origin = files.guest_tree, "live"
    else:
        with ui.step("Reading the workspace disk of the stopped VM"):
            guest = workspace.fetch_from_disk(files)
        source, origin = files.guest_tree, "disk"
    host = tree.scan(Path(record.project))
    _remove_leftover_temporaries(Path(record.project), host)
    changes = [c for c in compare(base, host, guest) if c.status is not Status.SAME]
    refs_changed = any(
        is_git_managed(p)
        and (p.startswith((".git/refs/", ".git/packed-refs")) or p == ".git/HEAD")
        and not same_entry(base.get(p), guest.get(p))
        for p in set(base) | set(guest)
    )
    return Gathered(record, changes, source, refs_changed, origin)


def _remove_leftover_temporaries(project: Path, host: tree.Manifest) -> None:
    """A pull killed with SIGKILL can leave its temporary files (never the target files) behind."""
    for path, entry in list(host.items()):
        if entry.kind == FILE and path.rsplit("/", 1)[-1].startswith(apply.TMP_PREFIX):
            (project / path).unlink(missing_ok=True)
            del host[path]


# ---------------------------------------------------------------- showing


def _is_text(data: bytes) -> bool:
    if b"\0" in data[:BINARY_SNIFF]:
        return False
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def describe(c: Change) -> str:
    g, b = c.guest, c.base
    if g is not None and g.kind == SYMLINK:
        return f"symlink → {g.target}"
    if g is not None and b is not None and g.kind == b.kind == FILE and g.digest == b.digest:
        return f"mode {b.mode & 0o7777:o} → {g.mode & 0o7777:o}"
    if g is not None and g.kind == FILE:
        return f"{b.size if b and b.kind == FILE else 0} → {g.size} bytes"
    return ""


def diff_text(g: Gathered, c: Change) -> str:
    """A unified diff for text, a one-line summary for anything else."""
    files = g.record.files
    head = f"--- a/{c.path}\n+++ b/{c.path}\n"
    if (c.guest and c.guest.kind != FILE) or (c.base and c.base.kind != FILE) or c.kind == "mode changed":
        return f"{c.path}: {c.kind}, {describe(c)}\n"
    old = apply.read_nofollow(files.baseline, c.path) if c.base else b""
    new = apply.read_nofollow(g.source, c.path) if c.guest else b""
    if old is None or new is None:
        return f"{c.path}: {c.kind}\n"
    if not (_is_text(old) and _is_text(new)):
        return f"Binary file {c.path}: {c.kind}, {len(old)} → {len(new)} bytes\n"
    lines = difflib.unified_diff(
        old.decode().splitlines(keepends=True),
        new.decode().splitlines(keepends=True),
        fromfile=f"a/{c.path}",
        tofile=f"b/{c.path}",
    )
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return text or head


def summary_table(changes: list[Change]) -> Any:
    from rich.table import Table

    table = Table("STATUS", "CHANGE", "PATH", "NOTE", box=None)
    for c in changes:
        status = {"apply": "[green]apply[/]", "conflict": "[red]conflict[/]", "unsafe": "[red]refused[/]"}[c.status]
        if c.risky and c.status is Status.APPLY:
            status = "[yellow]quarantined[/]"
        notes = "; ".join(filter(None, [c.risky, *c.notes, describe(c)]))
        table.add_row(status, c.kind, ui.printable(c.path), ui.printable(notes))
    return table


# ---------------------------------------------------------------- applying


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # guest copy kept beside the file
    quarantined: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)

    @property
    def left(self) -> int:
        return len(self.quarantined) + len(self.skipped) + len(self.failed)


def conflict_copy_name(path: str, session: str) -> str:
    return f"{path}.vmsandbox-{session}"


def _keep_conflict(g: Gathered, c: Change, owner: apply.Owner) -> str | None:
    if c.guest is None or c.guest.kind != FILE:
        return None
    data = apply.read_verified(g.source, c.path, c.guest)
    beside = conflict_copy_name(c.path, g.record.name)
    apply.write_file(g.project, beside, data, c.guest.mode & 0o666, owner)
    return beside


def execute(g: Gathered, accepted: list[Change], out: Outcome) -> None:
    """Apply the accepted changes in a safe order; conflicts keep the guest version beside the file."""
    owner = apply.Owner(g.record.uid, g.record.gid)
    done: list[Change] = []
    # Fault injection for the test suite: die with SIGKILL after N changes, as a killed pull would.
    die_after = int(os.environ.get("VMSANDBOX_TEST_KILL_PULL_AFTER", "-1"))
    for c in apply.order(accepted):
        if len(done) == die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            if c.status is Status.CONFLICT:
                beside = _keep_conflict(g, c, owner)
                out.conflicts.append(c.path + (f" (guest version: {beside})" if beside else " (deleted in the guest)"))
            else:
                apply.apply_one(g.project, g.source, c, owner)
                out.applied.append(c.path)
            done.append(c)
        except VmsandboxError as exc:
            out.failed.append(f"{c.path}: {exc.message}")
        except OSError as exc:
            out.failed.append(f"{c.path}: {exc.strerror}")
    _mark(g.record, done)


def _git(project: Path) -> list[str]:
    """git on the host project with nothing taken from what came out of the guest: no hooks run, objects
    are checked."""
    return [
        "git",
        "-C",
        str(project),
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "transfer.fsckObjects=true",
        "-c",
        "fetch.fsckObjects=true",
        "-c",
        "safe.directory=*",
    ]


def fetch_commits(g: Gathered) -> list[str]:
    """Bring the guest's branches and tags in as refs/remotes/vmsandbox-<name>/* and list the new commits.

    The source is the host-side mirror of the guest's repository (or the outbox's bundle). git's fetch from
    a local repository takes only objects and refs from it: that repository's hooks never run and the
    security-relevant parts of its config (e.g. uploadpack.packObjectsHook) are ignored by git itself.
    """
    if not g.refs_changed or not (g.project / ".git").is_dir():
        return []
    source = g.source / ".git" if g.origin != "outbox" else g.record.files.outbox / BUNDLE
    if not source.exists():
        return []
    prefix = f"refs/remotes/vmsandbox-{g.record.name}"
    git = _git(g.project)
    proc.run(
        [
            *git,
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-recurse-submodules",
            str(source),
            f"+refs/heads/*:{prefix}/*",
            f"+refs/tags/*:{prefix}/tags/*",
        ],
        hint="the guest's git repository could not be read; its working-tree files still sync",
    )
    listing = proc.run(
        [
            *git,
            "log",
            "--oneline",
            "--no-decorate",
            "--max-count=20",
            f"--glob={prefix}/*",
            "--not",
            "--branches",
            "--tags",
        ],
        check=False,
    )
    return listing.stdout.splitlines() or [f"refs updated under {prefix}/"]


# ---------------------------------------------------------------- exporting


def export(g: Gathered) -> Path:
    """Keep every pending change in the outbox (manifest, the changed files, a patch, the git bundle)."""
    files = g.record.files
    todo = pending(g)
    box = files.outbox
    staging = files.root / "outbox.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    (staging / OUTBOX_FILES).mkdir()
    manifest: dict[str, Any] = {}
    for c in todo:
        manifest[c.path] = c.guest.as_dict() if c.guest else None
        if c.guest is None:
            continue
        target = staging / OUTBOX_FILES / c.path
        target.parent.mkdir(parents=True, exist_ok=True)
        src = g.source / c.path
        if c.guest.kind == FILE:
            shutil.copy2(src, target, follow_symlinks=False)
        elif c.guest.kind == SYMLINK and c.guest.target is not None:
            target.symlink_to(c.guest.target)
        elif c.guest.kind == DIR:
            target.mkdir(exist_ok=True)
    (staging / OUTBOX_MANIFEST).write_text(json.dumps(manifest, indent=1))
    (staging / OUTBOX_PATCH).write_text("".join(diff_text(g, c) for c in todo))
    if g.origin != "outbox" and g.refs_changed and (g.project / ".git").is_dir():
        try:  # the guest's commits go into the project's refs/remotes now, and into a bundle for later
            fetch_commits(g)
            prefix = f"refs/remotes/vmsandbox-{g.record.name}"
            proc.run([*_git(g.project), "bundle", "create", "--quiet", str(staging / BUNDLE), f"--glob={prefix}/*"])
        except VmsandboxError as exc:
            ui.warn(f"could not keep the guest's commits: {exc.message}")
    elif g.origin == "outbox" and (box / BUNDLE).exists():
        shutil.copyfile(box / BUNDLE, staging / BUNDLE)
    if box.exists() and box != staging:
        shutil.rmtree(box)
    staging.rename(box)
    return box


# ---------------------------------------------------------------- the review


def select_paths(changes: list[Change], project: Path, wanted: list[str]) -> list[Change]:
    """Keep changes at or below the given paths (relative to the project, or absolute inside it)."""
    if not wanted:
        return changes
    rels = []
    for w in wanted:
        p = Path(w)
        rel = p.relative_to(project) if p.is_absolute() and p.is_relative_to(project) else p
        rels.append(str(rel).strip("/"))
    return [c for c in changes if any(r in ("", ".") or c.path == r or c.path.startswith(r + "/") for r in rels)]


def _ask(question: str, choices: str) -> str:
    while True:
        answer = ui.err.input(ui.printable(f"{question} [{'/'.join(choices)}] ")).strip()
        if answer in choices:
            return answer
        ui.err.print(f"answer one of: {', '.join(choices)}")


def _interactive(g: Gathered, todo: list[Change]) -> tuple[list[Change], bool]:
    """Per change: y apply, n skip, d diff, a apply all remaining safe changes, q stop. Returns (accepted, commits)."""
    accepted: list[Change] = []
    apply_rest = False
    for i, c in enumerate(todo, 1):
        if apply_rest and not c.risky and c.status is Status.APPLY:
            accepted.append(c)
            continue
        verb = "keep the guest version beside it" if c.status is Status.CONFLICT else "apply"
        warn = f" [yellow]⚠ {c.risky}[/]" if c.risky else ""
        ui.err.print(f"[bold]({i}/{len(todo)})[/] {c.kind} {ui.printable(c.path)} — {c.status.value}{warn}")
        while True:
            answer = _ask(f"  {verb}? y=yes n=no d=diff a=all safe q=quit", "yndaq")
            if answer == "d":
                ui.err.print(ui.printable(diff_text(g, c), markup=False), markup=False, highlight=False)
                continue
            break
        if answer == "q":
            break
        if answer in "ya":
            accepted.append(c)
        if answer == "a":
            apply_rest = True
    commits = (
        g.refs_changed
        and _ask(f"Fetch the guest's commits into refs/remotes/vmsandbox-{g.record.name}/*? y=yes n=no", "yn") == "y"
    )
    return accepted, commits


def review(
    g: Gathered, *, yes: bool, include_risky: bool, dry_run: bool, interactive: bool, only: list[str] | None = None
) -> Outcome:
    """Show the guest's changes and apply what is accepted. Nothing is applied without a terminal or --yes."""
    out = Outcome()
    changes = select_paths(g.changes, g.project, only or [])
    if not changes and not g.refs_changed:
        ui.info("No changes in the guest.")
        return out
    if changes:
        ui.err.print(summary_table(changes))
    shown = {c.path for c in changes}
    todo = [c for c in pending(g) if c.path in shown]
    out.refused = [f"{c.path}: {c.notes[0]}" for c in changes if c.status is Status.UNSAFE]
    if dry_run:
        ui.info(f"Dry run: {len(todo)} change(s) pending; nothing written.")
        out.skipped = [c.path for c in todo]
        return out
    held: list[Change] = []
    if interactive and not yes:
        accepted, commits = _interactive(g, todo)
    elif yes:
        held = [c for c in todo if c.risky and not include_risky]
        accepted = [c for c in todo if not c.risky or include_risky]
        out.quarantined = [f"{c.path} ({c.risky})" for c in held]
        commits = g.refs_changed
    else:
        ui.warn(
            "no terminal to review on and no --yes: nothing applied (rerun with --yes to apply the safe "
            "changes, or on a terminal to choose)"
        )
        out.skipped = [c.path for c in todo]
        return out
    decided = {c.path for c in accepted} | {c.path for c in held}
    out.skipped = [c.path for c in todo if c.path not in decided]
    execute(g, accepted, out)
    if commits:
        try:
            out.commits = fetch_commits(g)
        except VmsandboxError as exc:
            out.failed.append(f"git history: {exc.message}")
    return out


def report(g: Gathered, out: Outcome) -> None:
    left = len(pending(g))
    g.record.unsynced = left
    g.record.save()
    if not g.changes and not out.commits:
        return
    for label, items, colour in (
        ("applied", out.applied, "green"),
        ("conflict", out.conflicts, "red"),
        ("quarantined", out.quarantined, "yellow"),
        ("not applied", out.skipped, "yellow"),
        ("refused", out.refused, "red"),
        ("failed", out.failed, "red"),
    ):
        for item in items:
            ui.err.print(f"  [{colour}]{label}[/] {ui.printable(item)}", highlight=False)
    for line in out.commits:
        ui.err.print(f"  [cyan]commit[/] {ui.printable(line)}", highlight=False)
    parts = [f"{len(out.applied)} applied"]
    if out.conflicts:
        parts.append(f"{len(out.conflicts)} conflict(s) kept beside their files")
    if left:
        parts.append(f"{left} not synced")
    ui.info("Sync-back: " + ", ".join(parts) + ".")


# ---------------------------------------------------------------- push


def push(record: Record) -> tuple[list[str], list[str]]:
    """Send host edits made since the baseline into the guest. A path the guest also changed is not touched
    (reported as a conflict). Pushed paths become the new baseline. Returns (pushed, conflicts)."""
    if not is_running(record):
        raise VmsandboxError(f"session {record.name} has no running VM", hint="push needs a running session")
    files = record.files
    base = workspace.baseline(files)
    with ui.step("Fetching the guest's changes"):
        guest = workspace.fetch_live(record.endpoint(), record.project, files)
    host = tree.scan(Path(record.project))
    # the same three-way view with the roles swapped: the host is the side whose changes travel
    changes = [c for c in compare(base, guest, host) if not is_git_managed(c.path)]
    send = [c for c in changes if c.status is Status.APPLY]
    conflicts = [c.path for c in changes if c.status is Status.CONFLICT]
    if send:
        listing = files.root / "push.list"
        listing.write_text("".join(c.path + "\n" for c in send))
        endpoint = record.endpoint()
        with ui.step(f"Pushing {len(send)} host change(s) into the guest"):
            proc.run(
                [
                    "rsync",
                    "-a",
                    "--relative",
                    "--delete-missing-args",
                    f"--files-from={listing}",
                    f"--chown={record.uid}:{record.gid}",
                    "-e",
                    f"{endpoint.rsync_rsh()} -l root",
                    f"{record.project}/",
                    f"{endpoint.host_alias}:{record.project}/",
                ]
            )
        for c in send:  # the pushed state is what both sides now agree on
            _copy_entry(Path(record.project), files.baseline, c.path)
            if c.host is None:
                base.pop(c.path, None)
            else:
                base[c.path] = c.host
        paths.write_atomically(files.baseline_manifest, json.dumps(tree.to_json(base)))
    return [c.path for c in send], conflicts


def _copy_entry(src_root: Path, dst_root: Path, rel: str) -> None:
    src, dst = src_root / rel, dst_root / rel
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    else:
        dst.unlink(missing_ok=True)
    if not src.exists() and not src.is_symlink():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        dst.symlink_to(os.readlink(src))  # noqa: PTH115 - exact target
    elif src.is_dir():
        dst.mkdir()
        shutil.copystat(src, dst)
    else:
        shutil.copy2(src, dst)
