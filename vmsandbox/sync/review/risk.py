"""What a guest change may do to the host later: risky paths (quarantined: shown, applied only when asked)
and symlinks that lead out of the project (never created).

Both are judged the way an attacker would try to get around them:
- a risky name matches at any depth and the way the filesystems a project may live on compare names:
  case-insensitively (Unicode case folding, not lower()), with NTFS's trailing dots and spaces and HFS+'s
  ignorable code points dropped and the 8.3 short name `git~1` taken as `.git` (as git itself does);
- a symlink is judged by where it leads in the final tree, following the other symlinks of that tree (the
  guest's and the host's), never by the text of its target.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

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


MAX_HOPS = 40  # like the kernel's limit on symlinks followed in one lookup
MAX_STEPS = 4096  # work bound over all branches (a symlink that is one thing in one tree, another in the other)


class _Escape(Exception):  # noqa: N818 - control flow
    def __init__(self, why: str) -> None:
        self.why = why


def symlink_escape(path: str, trees: Sequence[Mapping[str, Entry]]) -> str | None:
    """Why the symlink at `path` (its target taken from the first tree that has it) leads out of the project
    when followed, or None if every way of following it stays inside.

    Each component is looked up in every tree: where it is a symlink in one of them, that link is followed
    too (the final tree holds the guest's changes and the host's files, and may hold either). `..` above the
    project root, an absolute target, or more than MAX_HOPS links in one lookup count as leaving."""
    found = next((t[path].target for t in trees if path in t and t[path].kind == SYMLINK), None)
    if found is None:
        return None
    target: str = found
    steps = [0]

    def walk(base: list[str], todo: list[str], hops: int) -> None:
        while todo:
            steps[0] += 1
            if steps[0] > MAX_STEPS:
                raise _Escape("too many symlinks to follow")
            part = todo.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not base:
                    raise _Escape("it leads above the project")
                base = base[:-1]
                continue
            here = [*base, part]
            key = "/".join(here)
            links: set[str] = set()
            plain = False
            for t in trees:
                entry = t.get(key)
                if entry is not None and entry.kind == SYMLINK and entry.target is not None:
                    links.add(entry.target)
                else:
                    plain = True
            for link in links:
                if hops + 1 > MAX_HOPS:
                    raise _Escape("too many levels of symlinks")
                if link.startswith("/"):
                    raise _Escape(f"it leads to {link} through {key}")
                walk(list(base), [*link.split("/"), *todo], hops + 1)
            if not plain:
                return
            base = here

    if target.startswith("/"):
        return f"it points to an absolute path ({target})"
    try:
        walk(path.split("/")[:-1], target.split("/"), 1)
    except _Escape as exc:
        return exc.why
    return None
