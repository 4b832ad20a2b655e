"""Review and sync-back: gather the guest's changes, show them, apply what is accepted, keep the rest.

Where guest changes come from, in order: the session's outbox (exported when its VM went away), the running
VM (rsync into the host mirror), or the workspace disk of a VM that died (read on the host).
What was applied or otherwise dealt with is recorded in review.json, so a change is reviewed once and an
interrupted pull can simply run again.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shutil
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmsandbox import confine, paths, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.core import Record, is_running
from vmsandbox.sync import apply, commits, transfer, tree, workspace
from vmsandbox.sync.compare import Change, Status, compare, is_git_managed
from vmsandbox.sync.risk import nested_git_dir
from vmsandbox.sync.tree import DIR, FILE, SYMLINK

OUTBOX_MANIFEST = "manifest.json"
OUTBOX_REFUSED = "refused.json"  # changes that can never be written, kept as a record (path, why, entry)
OUTBOX_FILES = "files"
OUTBOX_PATCH = "changes.patch"
BUNDLE = "git.bundle"
BINARY_SNIFF = 8192
DIFF_LIMIT = 1024**2  # larger files are summarised, not diffed
FREE_SPACE_RESERVE = 256 * 1024**2  # a pull never fills the project's filesystem to the last byte


@dataclass
class Gathered:
    record: Record
    changes: list[Change]  # the guest's changes against the baseline (SAME ones left out)
    source: Path  # where the guest's content is read from
    refs_changed: bool  # the guest added or moved branches or tags (its commits can be fetched)
    origin: str  # live | disk | outbox
    git_refused: str | None = None  # why the guest's repository is not read at all
    limit: int = 16 * 1024**3  # the sync budget: bytes a pull writes at most (and the largest file)

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


def gather(record: Record, *, limit: int) -> Gathered:
    """The guest's changes (from the outbox, the running VM or its disk) against the baseline and the host.
    `limit`: the sync budget in bytes (settings' sync_limit)."""
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
            guest = workspace.fetch_live(record.endpoint(), record.project, files, max_file_bytes=limit)
        source, origin = files.guest_tree, "live"
    else:
        with ui.step("Reading the workspace disk of the stopped VM"):
            guest = workspace.fetch_from_disk(files, max_file_bytes=limit)
        source, origin = files.guest_tree, "disk"
    host = tree.scan(Path(record.project))
    _remove_leftover_temporaries(Path(record.project), host)
    changes = [c for c in compare(base, host, guest) if c.status is not Status.SAME]
    refs_changed, refused = _guest_refs(files, origin)
    return Gathered(record, changes, source, refs_changed, origin, refused, limit)


def _guest_refs(files: paths.SessionPaths, origin: str) -> tuple[bool, str | None]:
    """Whether the guest has new or moved branches or tags, and why its repository is refused (if it is)."""
    if origin == "outbox":
        return (files.outbox / BUNDLE).exists(), None
    if not (files.baseline / ".git").is_dir() or files.baseline.joinpath(".git").is_symlink():
        return False, None  # the project had no repository of its own
    try:
        commits.check_guest_gitdir(files.guest_tree / ".git")
        guest_refs = commits.read_refs(files.guest_tree / ".git")
    except commits.Refused as exc:
        return False, exc.message
    return bool(commits.changed_refs(commits.read_refs(files.baseline / ".git"), guest_refs)), None


def _remove_leftover_temporaries(project: Path, host: tree.Manifest) -> None:
    """A pull killed with SIGKILL can leave its temporary files (never the target files) behind."""
    for path, entry in list(host.items()):
        if entry.kind == FILE and path.rsplit("/", 1)[-1].startswith(apply.TMP_PREFIX):
            (project / path).unlink(missing_ok=True)
            del host[path]


# ---------------------------------------------------------------- showing


def _head(root: Path, rel: str) -> bytes:
    fd = apply.open_nofollow(root, rel)
    if fd is None:
        return b""
    try:
        return os.read(fd, BINARY_SNIFF)
    finally:
        os.close(fd)


def _is_text(data: bytes) -> bool:
    if b"\0" in data[:BINARY_SNIFF]:
        return False
    try:
        data.decode()
    except UnicodeDecodeError as exc:
        return len(data) - exc.start < 4 and len(data) >= BINARY_SNIFF  # a character cut at the sniff's end
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
    old = apply.read_nofollow(files.baseline, c.path, limit=DIFF_LIMIT) if c.base else b""
    new = apply.read_nofollow(g.source, c.path, limit=DIFF_LIMIT) if c.guest else b""
    if old is None or new is None:
        sizes = f"{c.base.size if c.base else 0} → {c.guest.size if c.guest else 0} bytes"
        heads = [_head(files.baseline, c.path) if c.base else b"", _head(g.source, c.path) if c.guest else b""]
        if not all(_is_text(h) for h in heads):
            return f"Binary file {c.path}: {c.kind}, {sizes}\n"
        return f"{c.path}: {c.kind}, {sizes} (too large to diff)\n"
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


def grouped(changes: list[Change]) -> list[tuple[str, list[Change]]]:
    """Changes as the review shows them: one item each, except that everything inside a repository nested in
    the project (a `.git` below the top level) is one item, `DIR/.git/ (N paths)`. In path order."""
    items: list[tuple[str, list[Change]]] = []
    nested: dict[str, list[Change]] = {}
    for c in changes:
        gitdir = nested_git_dir(c.path)
        if gitdir is None:
            items.append((c.path, [c]))
        elif gitdir in nested:
            nested[gitdir].append(c)
        else:
            nested[gitdir] = [c]
            items.append((gitdir + "/", nested[gitdir]))
    return [
        (label if len(members) == 1 and not label.endswith("/") else f"{label} ({len(members)} paths)", members)
        for label, members in items
    ]


def _status_label(c: Change) -> str:
    if c.risky and c.status is Status.APPLY:
        return "[yellow]quarantined[/]"
    return {"apply": "[green]apply[/]", "conflict": "[red]conflict[/]", "unsafe": "[red]refused[/]"}[c.status]


def summary_table(changes: list[Change]) -> Any:
    from rich.table import Table

    table = Table("STATUS", "CHANGE", "PATH", "NOTE", box=None)
    for label, members in grouped(changes):
        c = members[0]
        if len(members) > 1:
            table.add_row(_status_label(c), "repository", ui.printable(label), ui.printable(c.risky or ""))
            continue
        shown = c.notes if c.status is Status.UNSAFE else [*c.notes, describe(c)]  # a refusal names the target
        notes = "; ".join(filter(None, [c.risky, *shown]))
        table.add_row(_status_label(c), c.kind, ui.printable(c.path), ui.printable(notes))
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
    beside = conflict_copy_name(c.path, g.record.name)
    not_executable = dataclasses.replace(c.guest, mode=c.guest.mode & 0o666)
    apply.copy_verified(g.source, g.project, c.path, not_executable, owner, dest=beside)
    return beside


def check_space(g: Gathered, accepted: list[Change]) -> None:
    """Before anything is written: the accepted files fit the session's sync budget and the project's
    filesystem (with a reserve). Otherwise nothing is applied."""
    need = sum(c.guest.size for c in accepted if c.guest is not None and c.guest.kind == FILE)
    if need > g.limit:
        raise VmsandboxError(
            f"the accepted changes add up to {need / 1024**2:.0f} MiB, more than the {g.limit // 1024**2} MiB "
            "a sync takes at once; nothing was applied",
            hint=f"pull part of it (`vmsandbox pull {g.record.name} PATHS`), or raise `sync_limit` in "
            "~/.config/vmsandbox/config.yaml",
        )
    free = shutil.disk_usage(g.project).free
    if need + FREE_SPACE_RESERVE > free:
        raise VmsandboxError(
            f"the accepted changes need {need / 1024**2:.0f} MiB and {g.project} has {free / 1024**2:.0f} MiB free "
            f"(keeping {FREE_SPACE_RESERVE // 1024**2} MiB in reserve); nothing was applied",
            hint="free space there, or pull part of it (`vmsandbox pull NAME PATHS`)",
        )


def execute(g: Gathered, accepted: list[Change], out: Outcome) -> None:
    """Apply the accepted changes in a safe order; conflicts keep the guest version beside the file."""
    owner = apply.Owner(g.record.uid, g.record.gid)
    check_space(g, accepted)
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


def fetch_commits(g: Gathered) -> list[str]:
    """Bring the guest's new or moved branches and tags in as refs/remotes/vmsandbox-<name>/* and list the new
    commits (commits.py: nothing but the guest's own objects is read, git runs as the invoking user). From an
    outbox, they come from the bundle exported earlier."""
    if not g.refs_changed or not _has_repository(g.project):
        return []
    if g.origin != "outbox":
        return commits.fetch(g.project, g.source, g.record.files.baseline, g.record.name, g.record.uid, g.record.gid)
    return commits.fetch_bundle(g.project, g.record.files.outbox / BUNDLE, g.record.name, g.record.uid, g.record.gid)


def _has_repository(project: Path) -> bool:
    git = project / ".git"
    return git.is_dir() and not git.is_symlink()


# ---------------------------------------------------------------- exporting


def export(g: Gathered) -> Path:
    """Keep every pending change in the outbox (manifest, the changed files, a patch, the git bundle), and a
    record of the refused ones (what they were and why they can never be written)."""
    files = g.record.files
    todo = pending(g)
    box = files.outbox
    staging = files.root / "outbox.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    (staging / OUTBOX_FILES).mkdir(mode=0o700)
    keeper = apply.Owner(os.geteuid(), os.getegid())
    manifest: dict[str, Any] = {}
    for c in apply.order(todo):
        manifest[c.path] = c.guest.as_dict() if c.guest else None
        if c.guest is None:
            continue
        if c.guest.kind == FILE:
            apply.copy_verified(g.source, staging / OUTBOX_FILES, c.path, c.guest, keeper)
        elif c.guest.kind == SYMLINK and c.guest.target is not None:
            apply.write_symlink(staging / OUTBOX_FILES, c.path, c.guest.target, keeper)
        elif c.guest.kind == DIR:
            apply.make_dir(staging / OUTBOX_FILES, c.path, c.guest.mode, keeper)
    refused = [
        {"path": c.path, "why": c.notes[0] if c.notes else "", "entry": c.guest.as_dict() if c.guest else None}
        for c in g.changes
        if c.status is Status.UNSAFE
    ]
    (staging / OUTBOX_MANIFEST).write_text(json.dumps(manifest, indent=1))
    (staging / OUTBOX_REFUSED).write_text(json.dumps(refused, indent=1))
    (staging / OUTBOX_PATCH).write_text("".join(diff_text(g, c) for c in todo))
    if g.origin != "outbox" and g.refs_changed and _has_repository(g.project):
        try:  # the guest's commits go into the project's refs/remotes now, and into a bundle for later
            fetch_commits(g)
            commits.bundle(g.project, staging / BUNDLE, g.record.name, g.record.uid, g.record.gid)
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
    """Per change (a nested repository is one): y apply, n skip, d diff, a apply all remaining safe changes,
    q stop. Returns (accepted, whether to fetch the guest's commits)."""
    accepted: list[Change] = []
    apply_rest = False
    items = grouped(todo)
    for i, (label, members) in enumerate(items, 1):
        c = members[0]
        if apply_rest and not c.risky and c.status is Status.APPLY:
            accepted += members
            continue
        verb = "keep the guest version beside it" if c.status is Status.CONFLICT else "apply"
        warn = f" [yellow]⚠ {ui.printable(c.risky)}[/]" if c.risky else ""
        kind = "repository" if len(members) > 1 else c.kind
        ui.err.print(f"[bold]({i}/{len(items)})[/] {kind} {ui.printable(label)} — {c.status.value}{warn}")
        while True:
            answer = _ask(f"  {verb}? y=yes n=no d=diff a=all safe q=quit", "yndaq")
            if answer == "d":
                text = "".join(diff_text(g, m) for m in members)
                ui.err.print(ui.printable(text, markup=False), markup=False, highlight=False)
                continue
            break
        if answer == "q":
            break
        if answer in "ya":
            accepted += members
        if answer == "a":
            apply_rest = True
    take = (
        g.refs_changed
        and _ask(f"Fetch the guest's commits into refs/remotes/vmsandbox-{g.record.name}/*? y=yes n=no", "yn") == "y"
    )
    return accepted, take


def review(
    g: Gathered, *, yes: bool, include_risky: bool, dry_run: bool, interactive: bool, only: list[str] | None = None
) -> Outcome:
    """Show the guest's changes and apply what is accepted. Nothing is applied without a terminal or --yes."""
    out = Outcome()
    changes = select_paths(g.changes, g.project, only or [])
    if not changes and not g.refs_changed and g.git_refused is None:
        ui.info("No changes in the guest.")
        return out
    if changes:
        ui.err.print(summary_table(changes))
    shown = {c.path for c in changes}
    todo = [c for c in pending(g) if c.path in shown]
    out.refused = [f"{c.path}: {c.notes[0]}" for c in changes if c.status is Status.UNSAFE]
    if g.git_refused is not None:
        out.refused.append(f"the guest's commits: {g.git_refused}")
    if dry_run:
        ui.info(f"Dry run: {len(todo)} change(s) pending; nothing written.")
        out.skipped = [c.path for c in todo]
        return out
    held: list[Change] = []
    if interactive and not yes:
        accepted, take_commits = _interactive(g, todo)
    elif yes:
        held = [c for c in todo if c.risky and not include_risky]
        accepted = [c for c in todo if not c.risky or include_risky]
        out.quarantined = [f"{label} ({members[0].risky})" for label, members in grouped(held)]
        take_commits = g.refs_changed
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
    if take_commits:
        try:
            out.commits = fetch_commits(g)
        except commits.Refused as exc:
            out.refused.append(f"the guest's commits: {exc.message}")
        except VmsandboxError as exc:
            out.failed.append(f"git history: {exc.message}")
    return out


def report(g: Gathered, out: Outcome) -> None:
    left = len(pending(g))
    g.record.unsynced = left
    g.record.save()
    if not g.changes and not out.commits and not out.refused:
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


def push(record: Record, *, limit: int) -> tuple[list[str], list[str]]:
    """Send host edits made since the baseline into the guest. A path the guest also changed is not touched
    (reported as a conflict). Pushed paths become the new baseline. Returns (pushed, conflicts)."""
    if not is_running(record):
        raise VmsandboxError(f"session {record.name} has no running VM", hint="push needs a running session")
    files = record.files
    base = workspace.baseline(files)
    with ui.step("Fetching the guest's changes"):
        guest = workspace.fetch_live(record.endpoint(), record.project, files, max_file_bytes=limit)
    host = tree.scan(Path(record.project))
    # the same three-way view with the roles swapped: the host is the side whose changes travel
    changes = [c for c in compare(base, guest, host) if not is_git_managed(c.path)]
    send = [c for c in changes if c.status is Status.APPLY]
    conflicts = [c.path for c in changes if c.status is Status.CONFLICT]
    if send:
        endpoint = record.endpoint()
        remote = record.project.rstrip("/") + "/"
        # the host side reads the user's project as the user; the guest's rsync never talks to root here
        side = transfer.Side(confine.invoking_user(record.uid, record.gid), confine.GIT_LIMITS, Path(record.project))
        with ui.step(f"Pushing {len(send)} host change(s) into the guest"):
            transfer.rsync(
                endpoint,
                [
                    "-a",
                    "--relative",
                    "--delete-missing-args",
                    "--files-from=-",
                    "--from0",
                    f"--chown={record.uid}:{record.gid}",
                ],
                remote,
                f"{endpoint.host_alias}:{remote}",
                side=side,
                expect_sender=False,
                remote_path=remote,
                input=b"".join(c.path.encode("utf-8", "surrogateescape") + b"\0" for c in send),
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
