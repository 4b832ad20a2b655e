"""What a guest change may do to the host later: risky paths (quarantined: shown, applied only when asked)
and symlinks that lead out of the project (never created).

Both are judged the way an attacker would try to get around them:
- a risky name matches at any depth and the way the filesystems a project may live on compare names:
  case-insensitively (Unicode case folding, not lower()), with NTFS's trailing dots and spaces and HFS+'s
  ignorable code points dropped and the 8.3 short name `git~1` taken as `.git` (as git itself does);
- a symlink is judged by where it leads in the tree as it will be after the apply (sync.tree.final), following
  every link of that tree (the guest's and the host's), never by the text of its target; a component nobody
  has is unknown, not a directory; and a change that makes a link already on the host lead out is refused.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence

from vmsandbox.confine.beneath import Unreadable
from vmsandbox.confine.resolve import Reach
from vmsandbox.sync.tree.final import Final
from vmsandbox.sync.tree.manifest import SYMLINK, Entry

# Places where a file becomes code that runs on the host later (hooks, editors, agents, CI, env loaders,
# package managers, version pins that pick binaries) or configures a tool that does. Each pattern is a name
# or a short path ("a/b"), matched at any depth; a match covers everything below it. `*` globs.
RISKY_PATTERNS: tuple[tuple[str, str], ...] = (
    # version control internals
    (".git", "git internals: hooks and config (core.hooksPath, core.fsmonitor, filters, aliases) run code"),
    (".gitattributes", "git attributes bind filters and diff drivers that run commands"),
    (".gitmodules", "submodule URLs and update commands"),
    (".hg", "Mercurial internals (hooks in .hg/hgrc)"),
    (".svn", "Subversion internals"),
    (".jj", "jujutsu internals (config, aliases)"),
    # this tool
    (".vmsandbox.yaml", "vmsandbox project config (used only after `vmsandbox config trust add`)"),
    (".vmsandbox", "vmsandbox project blueprints (used only after `vmsandbox config trust add`)"),
    # git hook managers
    (".husky", "git hooks (husky)"),
    (".githooks", "git hooks"),
    (".pre-commit-config.yaml", "pre-commit hooks"),
    ("lefthook.yml", "git hooks (lefthook)"),
    (".lefthook.yml", "git hooks (lefthook)"),
    ("lefthook-local.yml", "git hooks (lefthook)"),
    (".overcommit.yml", "git hooks (overcommit)"),
    # shells, editors, debuggers
    (".envrc", "direnv runs it when you cd into the project"),
    (".vscode", "editor tasks, launch configs and settings can run programs"),
    ("*.code-workspace", "VS Code workspace settings and tasks"),
    (".idea", "IDE run configurations and settings"),
    (".fleet", "Fleet run configurations"),
    (".zed", "Zed tasks and settings"),
    (".devcontainer", "dev container definitions run commands"),
    (".devcontainer.json", "dev container definition runs commands"),
    (".exrc", "vim/neovim run it with 'exrc'"),
    (".nvimrc", "neovim runs it with 'exrc'"),
    (".nvim.lua", "neovim runs it with 'exrc'"),
    (".dir-locals.el", "Emacs evaluates it"),
    (".dir-locals-2.el", "Emacs evaluates it"),
    (".pdbrc", "pdb runs it"),
    (".pdbrc.py", "pdb runs it"),
    (".gdbinit", "gdb runs it"),
    (".lldbinit", "lldb runs it"),
    (".irbrc", "irb runs it"),
    (".pryrc", "pry runs it"),
    (".clangd", "clangd settings (compile commands, drivers)"),
    # coding agents on the host
    (".claude", "Claude Code settings: hooks run commands"),
    (".mcp.json", "MCP servers: commands an agent starts"),
    (".gemini", "Gemini CLI settings and MCP servers"),
    (".codex", "Codex settings"),
    (".opencode", "opencode settings and plugins"),
    ("opencode.json", "opencode settings (MCP servers run commands)"),
    ("opencode.jsonc", "opencode settings (MCP servers run commands)"),
    (".cursor", "Cursor settings and MCP servers"),
    (".windsurf", "Windsurf settings"),
    (".continue", "Continue settings and MCP servers"),
    (".aider.conf.yml", "aider settings (lint and test commands)"),
    # CI
    (".github/workflows", "CI workflow"),
    (".github/actions", "CI actions"),
    (".gitea/workflows", "CI workflow"),
    (".forgejo/workflows", "CI workflow"),
    (".gitlab-ci.yml", "CI pipeline"),
    (".circleci", "CI pipeline"),
    (".travis.yml", "CI pipeline"),
    ("Jenkinsfile", "CI pipeline"),
    ("azure-pipelines.yml", "CI pipeline"),
    ("bitbucket-pipelines.yml", "CI pipeline"),
    (".buildkite", "CI pipeline"),
    (".drone.yml", "CI pipeline"),
    (".woodpecker", "CI pipeline"),
    (".woodpecker.yml", "CI pipeline"),
    # package managers and toolchains
    (".npmrc", "npm settings (script-shell, registries, tokens)"),
    (".yarnrc", "yarn settings"),
    (".yarnrc.yml", "yarn settings (yarnPath runs a file)"),
    (".yarn/releases", "yarn runs the release yarnPath names"),
    (".yarn/plugins", "yarn loads its plugins"),
    (".pnpmfile.cjs", "pnpm runs it on install"),
    (".cargo", "cargo settings (runners, wrappers, aliases)"),
    ("rust-toolchain", "rustup toolchain (a local path runs its binaries)"),
    ("rust-toolchain.toml", "rustup toolchain (a local path runs its binaries)"),
    (".mvn", "maven wrapper and settings"),
    ("gradle/wrapper", "gradle wrapper downloads and runs a distribution"),
    (".bundle", "bundler settings"),
    (".tool-versions", "asdf installs and runs plugins"),
    ("mise.toml", "mise tasks, hooks and tools"),
    (".mise.toml", "mise tasks, hooks and tools"),
    ("mise.local.toml", "mise tasks, hooks and tools"),
    (".mise.local.toml", "mise tasks, hooks and tools"),
    (".mise", "mise config"),
    (".config/mise", "mise config"),
    (".config/mise.toml", "mise config"),
    (".python-version", "pyenv picks the interpreter"),
    (".nvmrc", "nvm picks the node binary"),
    (".node-version", "node version managers pick the binary"),
    (".ruby-version", "ruby version managers pick the interpreter"),
)

# Code points HFS+ ignores in names, so ".g\u200cit" is ".git" there (git's is_hfs_dot_generic).
_IGNORABLE = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF],
)
_SHORT_NAMES = {"git~1": ".git"}  # NTFS 8.3 aliases


def normalize(name: str) -> str:
    """A path component as a case-insensitive, NTFS- or HFS+-backed filesystem would see it."""
    plain = name.translate(_IGNORABLE).casefold()  # NTFS upper-cases the long s (U+017F) to S; lower() keeps it
    trimmed = plain.rstrip(". ") or plain
    return _SHORT_NAMES.get(trimmed, trimmed)


def _compile() -> tuple[dict[str, str], list[tuple[tuple[str, ...], str]]]:
    names: dict[str, str] = {}
    others: list[tuple[tuple[str, ...], str]] = []
    for pattern, why in RISKY_PATTERNS:
        parts = tuple(normalize(p) for p in pattern.split("/"))
        if len(parts) == 1 and not any(c in parts[0] for c in "*?["):
            names[parts[0]] = why
        else:
            others.append((parts, why))
    return names, others


_NAMES, _OTHERS = _compile()


def risky_name(path: str) -> str | None:
    """Why a path is risky by its name (at any depth, any case), or None."""
    parts = [normalize(p) for p in path.split("/")]
    for part in parts:
        why = _NAMES.get(part)
        if why is not None:
            return why
    for pattern, why in _OTHERS:
        k = len(pattern)
        for i in range(len(parts) - k + 1):
            if all(fnmatch.fnmatchcase(parts[i + j], pattern[j]) for j in range(k)):
                return why
    return None


def nested_git_dir(path: str) -> str | None:
    """The `.git` directory (below the project's top level) that path is in or is, or None: the internals
    of a repository nested in the project, shown as one item."""
    parts = path.split("/")
    for i, part in enumerate(parts[1:], 1):
        if normalize(part) == ".git":
            return "/".join(parts[: i + 1])
    return None


UNKNOWN = "neither the project nor the guest has: where the link leads is not known until that exists"
Changed = tuple[str, Entry | None, Entry | None]  # a change's path, the guest's entry and the host's


def not_known(exc: Unreadable, what: str = "") -> str:
    """Why a change is refused when the project holds what cannot be read (beneath.Unreadable): it stands until a
    pull that can read it (`what`: what was not known)."""
    return f"not written: {what}{exc.message}; {exc.hint}" if exc.hint else f"not written: {what}{exc.message}"


def judge_links(
    final: Final, changes: Sequence[Changed], host_links: Callable[[], Mapping[str, str]]
) -> tuple[dict[str, str], dict[str, str]]:
    """Every change judged by where links lead in the tree as it will be (`final`: the host's links and the
    guest's, every component resolved, names compared as the project's file system does): the changes that can
    never be written, and why; the links that wait for a person, and why.

    - A guest's link is refused when it leads out in any way of taking the review (through another link of
      either side, an absolute target, a loop), or would lead out once a component nobody has yet exists; it
      waits for a person when it passes a component nobody has (it leads nowhere today: what is made there
      later decides).
    - A change at a path that a link already on the host passes through is refused when, with it, that link
      would lead out where it did not before (`host_links`: every link on the host, asked only then)."""
    refused: dict[str, str] = {}
    unknown: dict[str, str] = {}
    for path, guest, _host in changes:
        if guest is None or guest.kind != SYMLINK or guest.target is None:
            continue
        try:
            verdict = final.leads(path, guest.target, {final.key(path): guest})
        except Unreadable as exc:  # (the host's side of a component on the way)
            refused[path] = not_known(exc, "where the link leads is not known, as ")
            continue
        if verdict.reach is not Reach.INSIDE:
            refused[path] = f"symlink to {guest.target!r} leaves the project: {verdict.why}"
        elif verdict.unresolved is not None:
            unknown[path] = f"a link through {verdict.unresolved}, which {UNKNOWN}"
    for path, why in _leading_host_links_out(final, changes, host_links).items():
        refused.setdefault(path, why)
    return refused, unknown


def _leading_host_links_out(
    final: Final, changes: Sequence[Changed], host_links: Callable[[], Mapping[str, str]]
) -> dict[str, str]:
    """The changes that would make a link already on the host lead out (only a change where either side is a
    link can move where a name resolves: a directory made where nothing was reads as the walk already read it)."""
    moved = {
        final.key(path): (path, guest)
        for path, guest, host in changes
        if any(e is not None and e.kind == SYMLINK for e in (guest, host))
    }
    if not moved:
        return {}
    blamed: dict[str, str] = {}
    try:
        _blame(final, moved, host_links(), blamed)
    except Unreadable as exc:  # a link there is not known: none can be said to stay inside
        why = not_known(exc, "whether it makes a link already in the project lead out is not known, as ")
        return {path: blamed.get(path, why) for path, _guest in moved.values()}
    return blamed


def _blame(
    final: Final, moved: Mapping[str, tuple[str, Entry | None]], links: Mapping[str, str], blamed: dict[str, str]
) -> None:
    """Put in `blamed` each moved change (by its key) that makes one of the host's `links` lead out."""
    for at, target in sorted(links.items()):
        every = final.leads(at, target)
        hit = sorted(every.through & moved.keys())
        if every.reach is Reach.INSIDE or not hit:
            continue
        before = final.leads_now(at, target).reach  # a link that leads out already is the host's own
        for key in hit:
            path, guest = moved[key]
            taken = final.leads(at, target, {key: guest})
            if path not in blamed and taken.reach > before:
                blamed[path] = f"with it, the link {at} -> {target!r} already in the project leads out: {taken.why}"
