"""The three-way view: for each path, compare the baseline, the host now and the guest now.

Everything from the guest is hostile: this module only classifies; apply.py decides how (and whether) a change
may be written. Risky paths — places where a file turns into code the host runs later — are quarantined.
"""

from __future__ import annotations

import enum
import fnmatch
import posixpath
from dataclasses import dataclass, field

from vmsandbox.tree import DIR, FILE, OTHER, SYMLINK, Entry, Manifest

# .git internals that git itself manages: commits come back as fetched refs, never as these files.
GIT_MANAGED = (
    "objects/",
    "refs/",
    "logs/",
    "index",
    "packed-refs",
    "HEAD",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "COMMIT_EDITMSG",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "AUTO_MERGE",
    "REBASE_HEAD",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "rebase-merge/",
    "rebase-apply/",
    "gitk.cache",
)

# Places where a file becomes code that runs on the host later (hooks, editors, CI, env loaders, package
# manager hooks). Matched against the path and, for names without "/", against every path component.
RISKY_PATTERNS: tuple[tuple[str, str], ...] = (
    (".git/*", "git internals (hooks, config: core.hooksPath, core.fsmonitor, filters, aliases run code)"),
    (".gitattributes", "git attributes can bind filters and diff drivers that run commands"),
    (".gitmodules", "submodule URLs and update commands"),
    (".husky/*", "git hooks (husky)"),
    (".githooks/*", "git hooks"),
    (".pre-commit-config.yaml", "pre-commit hooks"),
    (".envrc", "direnv runs it when you cd into the project"),
    (".vscode/*", "editor tasks, launch configs and settings can run programs"),
    (".idea/*", "IDE run configurations and settings"),
    (".devcontainer/*", "dev container definitions run commands"),
    (".github/workflows/*", "CI workflow"),
    (".github/actions/*", "CI actions"),
    (".gitlab-ci.yml", "CI pipeline"),
    (".circleci/*", "CI pipeline"),
    (".travis.yml", "CI pipeline"),
    ("Jenkinsfile", "CI pipeline"),
    ("azure-pipelines.yml", "CI pipeline"),
    (".buildkite/*", "CI pipeline"),
    (".npmrc", "npm settings (script-shell, registries, tokens)"),
    (".yarnrc", "yarn settings"),
    (".yarnrc.yml", "yarn settings (yarnPath runs a file)"),
    (".pnpmfile.cjs", "pnpm runs it on install"),
    (".cargo/config", "cargo settings (runners, wrappers)"),
    (".cargo/config.toml", "cargo settings (runners, wrappers)"),
    (".mvn/*", "maven wrapper and settings"),
    ("gradle/wrapper/*", "gradle wrapper downloads and runs a distribution"),
    (".tool-versions", "asdf installs and runs plugins"),
    (".python-version", "pyenv picks the interpreter"),
    (".nvmrc", "nvm picks the node binary"),
)


class Status(enum.StrEnum):
    APPLY = "apply"  # the guest changed it, the host did not: it can land
    CONFLICT = "conflict"  # both changed it differently: the host file is never touched
    SAME = "same"  # both made the same change: nothing to do
    UNSAFE = "unsafe"  # can never be written (FIFO, device, symlink leaving the tree, bad name)


@dataclass
class Change:
    path: str
    base: Entry | None
    guest: Entry | None
    host: Entry | None
    status: Status
    risky: str | None = None  # why it is quarantined
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.base is None:
            return "added"
        if self.guest is None:
            return "deleted"
        if self.base.kind != self.guest.kind:
            return "type changed"
        if self.base.kind == FILE and self.base.digest == self.guest.digest:
            return "mode changed"
        return "modified"


def is_git_managed(path: str) -> bool:
    if not path.startswith(".git/"):
        return False
    inner = path[len(".git/") :]
    return any(inner == p.rstrip("/") or (p.endswith("/") and inner.startswith(p)) for p in GIT_MANAGED)


def risk_of(path: str, base: Entry | None, guest: Entry | None) -> str | None:
    parts = path.split("/")
    for pattern, why in RISKY_PATTERNS:
        if "/" in pattern:
            if fnmatch.fnmatchcase(path, pattern) or path == pattern.rstrip("/*"):
                return why
        elif pattern in parts:
            return why
    newly_executable = guest is not None and guest.kind == FILE and guest.mode & 0o111
    if newly_executable and (base is None or base.kind != FILE or not base.mode & 0o111):
        return "newly executable"
    return None


def symlink_escapes(path: str, target: str) -> bool:
    """Whether a symlink at `path` (relative to the project root) with `target` points outside the tree."""
    if target.startswith("/"):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return resolved == ".." or resolved.startswith("../")


def unsafe_reason(path: str, guest: Entry | None) -> str | None:
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        return "invalid path"
    if guest is None:
        return None
    if guest.kind == OTHER:
        return "FIFOs, sockets and device files are never created"
    if guest.kind == SYMLINK and guest.target is not None and symlink_escapes(path, guest.target):
        return f"symlink leaves the project ({guest.target})"
    return None


def notes_for(guest: Entry | None) -> list[str]:
    if guest is not None and guest.kind in (FILE, DIR) and guest.mode & 0o7000:
        return ["setuid/setgid/sticky bits dropped"]
    return []


def compare(baseline: Manifest, host: Manifest, guest: Manifest) -> list[Change]:
    """Every path the guest changed against the baseline, classified. Sorted by path."""
    changes: list[Change] = []
    for path in sorted(set(baseline) | set(guest)):
        if is_git_managed(path):
            continue
        base, g, h = baseline.get(path), guest.get(path), host.get(path)
        if same_entry(base, g):
            continue
        if same_entry(g, h):
            status = Status.SAME
        elif same_entry(base, h):
            status = Status.APPLY
        else:
            status = Status.CONFLICT
        if status is not Status.SAME and unsafe_reason(path, g):
            status = Status.UNSAFE
        change = Change(path, base, g, h, status, risk_of(path, base, g), notes_for(g))
        if status is Status.UNSAFE:
            change.notes.insert(0, unsafe_reason(path, g) or "")
        changes.append(change)
    return changes


def same_entry(a: Entry | None, b: Entry | None) -> bool:
    """Equal as far as a sync can carry: setuid/setgid/sticky bits never travel, so they never differ."""
    if a is None or b is None:
        return a is None and b is None
    if a.kind in (DIR, FILE) and a.kind == b.kind:
        return a.mode & 0o777 == b.mode & 0o777 and a.digest == b.digest
    return a.same(b)
