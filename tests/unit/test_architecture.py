"""The package layout holds (docs/architecture.md): dependencies point one way, and the one-module rules for
libvirt, subprocess and paramiko stand. Read from the source as text; nothing is imported or run."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vmsandbox"
# Higher imports lower, never the other way; siblings not at all, but for the one named exception.
LAYER = {"cli": 5, "session": 4, "sync": 3, "egress": 3, "image": 3, "guest": 2, "vm": 1}
SIBLINGS_ALLOWED = {("image", "egress")}  # blueprints use egress.mapping, the secret-mapping type


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vmsandbox"):
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("vmsandbox")]
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYER else "base"


def test_dependencies_point_one_way() -> None:
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.name == "__main__.py":
            continue
        here = rel.parts[0] if len(rel.parts) > 1 else "base"
        for module in _imports(path):
            there = _package(module)
            if there in (here, "base"):
                continue
            upward = here == "base" or LAYER[there] > LAYER[here]
            sideways = LAYER.get(there) == LAYER.get(here) and (here, there) not in SIBLINGS_ALLOWED
            if upward or sideways:
                wrong.append(f"{rel} imports {module}")
    assert wrong == []


def test_one_module_each_for_libvirt_subprocess_and_paramiko() -> None:
    users: dict[str, set[str]] = {"libvirt": set(), "subprocess": set(), "paramiko": set()}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            for name in names:
                if name in users:
                    users[name].add(str(path.relative_to(PACKAGE)))
    assert users == {"libvirt": {"vm/virt.py"}, "subprocess": {"proc.py"}, "paramiko": {"guest/channel.py"}}


def test_no_test_switch_in_the_product() -> None:
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "VMSANDBOX_TEST" in p.read_text() and p.name != "failpoint.py"
    ]
    assert offenders == []


def test_modules_and_functions_stay_small() -> None:
    big = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") > 310:
            big.append(f"{path.relative_to(PACKAGE)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    big.append(f"{path.relative_to(PACKAGE)}:{node.name}: {length} lines")
    assert big == []


# The tools that parse guest bytes on the host. Each call that starts one names a jail (jail.py), but for the
# calls listed here, which never see guest data: mkfs/debugfs on our own fresh images, the host user's git config.
GUEST_DATA_TOOLS = {"e2fsck", "debugfs", "git", "rsync"}
NEVER_GUEST_DATA = {("vm/ext4.py", "remove_dir"), ("guest/files.py", "git_identity")}


def _tool_of(call: ast.Call) -> str | None:
    """The tool a proc.run/proc.start call starts, when its argv is a list literal naming it."""
    if not call.args or not isinstance(call.args[0], ast.List) or not call.args[0].elts:
        return None
    first = call.args[0].elts[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _tool_calls() -> Iterator[tuple[str, str, ast.Call]]:
    """(module, function, call) for every call in a function of the package whose argv names a tool."""
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and _tool_of(node) is not None:
                    yield rel, func.name, node


def test_no_guest_data_tool_runs_outside_the_jail() -> None:
    """e2fsck, debugfs, git and rsync are started only with `jail=` (git through commits.run_git, which jails)."""
    unjailed = []
    for rel, name, node in _tool_calls():
        if not isinstance(node.func, ast.Attribute) or node.func.attr not in ("run", "start"):
            continue
        if _tool_of(node) not in GUEST_DATA_TOOLS:
            continue
        if any(k.arg == "jail" for k in node.keywords) or (rel, name) in NEVER_GUEST_DATA:
            continue
        unjailed.append(f"{rel}:{name} starts {_tool_of(node)}")
    assert unjailed == []


def test_no_filesystem_tool_reads_a_guest_written_disk() -> None:
    """e2fsck is never started, debugfs only on the images the host itself just made: a disk the guest wrote
    is mounted by a reader VM's kernel (session.diskreader), never parsed on the host, jailed or not."""
    fs_tools = ("e2fsck", "debugfs", "fsck.ext4", "fsck")
    starts = [(rel, name, _tool_of(node)) for rel, name, node in _tool_calls() if _tool_of(node) in fs_tools]
    assert starts == [("vm/ext4.py", "remove_dir", "debugfs")]
