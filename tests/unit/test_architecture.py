"""The package layout holds (docs/architecture.md): dependencies point one way, and the one-module rules for
libvirt, subprocess and paramiko stand. Read from the source as text; nothing is imported or run."""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vmsandbox"
# Higher imports lower, never the other way; siblings not at all, but for the one named exception. Every folder
# and every module of the top folder has its floor: the top folder's modules are the foundation (0) every layer
# stands on, but for the two that stand on confine/ (proc jails what it starts; trust reads a config directory
# beneath a root). A module of the top folder with no floor here fails the test: it is placed before it is used.
LAYER = {
    "cli": 8, "web": 8, "api": 8, "mcp": 8, "core": 7, "session": 6, "sync": 5, "egress": 5, "image": 5, "guest": 4,
    "vm": 3, "proc": 2, "trust": 2, "confine": 1,
    "errors": 0, "ui": 0, "paths": 0, "filewrite": 0, "sudo": 0, "pids": 0, "packages": 0, "failpoint": 0,
    "filemodels": 0, "document": 0, "schema": 0, "__init__": 0,
}  # fmt: skip
FOUNDATION_FLOOR = 0  # its modules import one another freely (the cycle test still holds them)
SIBLINGS_ALLOWED = {("image", "egress"), ("cli", "web"), ("cli", "api"), ("cli", "mcp")}
# blueprints use egress.rules.mapping (the secret-mapping type); `vmsandbox ui` (cli/webui.py) serves the web edge,
# `vmsandbox serve` (cli/serve.py) the API, `vmsandbox mcp` (cli/mcp.py) the MCP server.
# Never the web or the API from the CLI's other modules: below.


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vmsandbox"):
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("vmsandbox")]
    return found


def _every_import(path: Path) -> list[str]:
    """Every module `path` imports, ours and others' (the modules named, not the names taken from them)."""
    tree = ast.parse(path.read_text())
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return modules + [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]


def _floor_of(module: str) -> str | None:
    """The LAYER key of an imported name: its folder, or its module of the top folder (None: the package itself, or
    a name it holds, `vmsandbox.__version__`)."""
    parts = module.split(".")
    return None if len(parts) == 1 or parts[1].startswith("__") else parts[1]


def _upward_or_sideways(here: str, there: str) -> bool:
    if here == there:
        return False
    if LAYER[there] > LAYER[here]:
        return True
    same = LAYER[there] == LAYER[here] and LAYER[here] != FOUNDATION_FLOOR
    return same and (here, there) not in SIBLINGS_ALLOWED


def test_every_folder_and_base_module_has_a_floor() -> None:
    top = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__main__.py"}
    top |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert top - set(LAYER) == set()


def test_dependencies_point_one_way() -> None:
    """No import runs up the floors or sideways between two folders of one floor, the foundation's modules
    included (`__main__.py`, the entry point, starts the CLI)."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.name == "__main__.py":
            continue
        here = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for module in _imports(path):
            there = _floor_of(module)
            if there is not None and _upward_or_sideways(here, there):
                wrong.append(f"{rel} imports {module}")
    assert wrong == []


def test_the_layer_rule_finds_an_arrow_up_from_the_foundation() -> None:
    assert _upward_or_sideways("paths", "confine") and _upward_or_sideways("proc", "vm")
    assert _upward_or_sideways("sync", "egress") and not _upward_or_sideways("image", "egress")
    assert not _upward_or_sideways("paths", "sudo") and not _upward_or_sideways("proc", "confine")
    assert _floor_of("vmsandbox") is None and _floor_of("vmsandbox.__version__") is None
    assert _floor_of("vmsandbox.confine.beneath") == "confine" and _floor_of("vmsandbox.paths.data_dir") == "paths"


WEB_LAUNCHERS = (
    "cli/review/webui.py",
    "cli/sessions/run.py",
)  # `vmsandbox ui`, and the review at the end of `run --review web`


def test_the_web_page_is_an_edge_beside_the_cli() -> None:
    """vmsandbox/web reaches the core as cli/ does and nothing but `vmsandbox ui` and `run --review web` reach it;
    the web's own libraries (the ASGI framework, the server, the templates) stay in it."""
    wrong = []
    web_libraries = ("starlette", "uvicorn", "jinja2", "markupsafe")
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        for module in _every_import(path):
            if module.startswith("vmsandbox.web") and not rel.startswith("web/") and rel not in WEB_LAUNCHERS:
                wrong.append(f"{rel} imports {module}")
            if module.startswith("vmsandbox.cli") and rel.startswith("web/"):
                wrong.append(f"{rel} imports {module}")
            served_here = rel.startswith(("web/", "api/", "mcp/")) or rel == "cli/review/webui.py"
            if module.split(".")[0] in web_libraries and not served_here:
                wrong.append(f"{rel} imports {module}")
    assert wrong == []


def _beside_the_cli(edge: str, launcher: str, others: tuple[str, ...], libraries: tuple[str, ...] = ()) -> list[str]:
    """What breaks the rule of an edge beside the CLI: only its `launcher` (a CLI module) reaches it, it reaches none
    of the `others` front ends, and its own `libraries` are imported in it only."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        inside = rel.startswith(f"{edge}/")
        for module in _every_import(path):
            reached = module.startswith(f"vmsandbox.{edge}") and not inside and rel != launcher
            reaches = inside and module.startswith(tuple(f"vmsandbox.{o}" for o in others))
            if reached or reaches or (module.split(".")[0] in libraries and not inside):
                wrong.append(f"{rel} imports {module}")
    return wrong


def test_the_api_is_an_edge_beside_the_cli() -> None:
    """vmsandbox/api (`vmsandbox serve`) reaches the core as cli/ and web/ do; nothing but cli/serve.py reaches it,
    and it reaches neither cli/ nor web/."""
    assert _beside_the_cli("api", "cli/serve.py", ("cli", "web", "mcp")) == []


def test_the_mcp_server_is_an_edge_beside_the_cli() -> None:
    """vmsandbox/mcp (`vmsandbox mcp`) reaches the core as the others do; nothing but cli/mcp.py reaches it, it
    reaches no other front end, and the MCP SDK is imported in it only."""
    assert _beside_the_cli("mcp", "cli/mcp.py", ("cli", "web", "api"), ("mcp", "mcp_types")) == []


FRONT_ENDS = ("cli", "web", "api", "mcp")  # each asks the core, and shows
FOUNDATION = (
    "vmsandbox.errors", "vmsandbox.ui", "vmsandbox.paths", "vmsandbox.filewrite", "vmsandbox.sudo", "vmsandbox.pids",
    "vmsandbox.proc",
)  # fmt: skip
SERVES = {  # the one CLI module that starts each other edge: `ui`, `run --review web`, `serve`
    "cli/review/webui.py": "vmsandbox.web",
    "cli/sessions/run.py": "vmsandbox.web",
    "cli/serve.py": "vmsandbox.api",
    "cli/mcp.py": "vmsandbox.mcp",
}


def _reaches(module: str, allowed: tuple[str, ...]) -> bool:
    return module in ("vmsandbox", "vmsandbox.__version__") or any(
        module == a or module.startswith(a + ".") for a in allowed
    )


def test_a_front_end_reaches_only_the_cores_surface() -> None:
    """A front end (the command line, the page, the API) parses, calls the core (vmsandbox/core) and shows: it
    reaches no session, sync, egress, image, VM or guest module of its own accord, only the core and the
    foundation every layer shares (errors, ui, paths, sudo, pids, proc), and the CLI the edge a
    module of it serves. Function-local imports count."""
    wrong = []
    for front in FRONT_ENDS:
        for path in (PACKAGE / front).rglob("*.py"):
            served = SERVES.get(str(path.relative_to(PACKAGE)))
            allowed = ("vmsandbox.core", f"vmsandbox.{front}", *FOUNDATION, *([served] if served else []))
            wrong += [f"{path.relative_to(PACKAGE)} imports {m}" for m in _imports(path) if not _reaches(m, allowed)]
    assert wrong == []


def test_the_front_end_rule_finds_a_reach_past_the_core() -> None:
    allowed = ("vmsandbox.core", "vmsandbox.web", *FOUNDATION)
    assert _reaches("vmsandbox.core.views.Plan", allowed) and _reaches("vmsandbox.errors.VmsandboxError", allowed)
    assert not _reaches("vmsandbox.session.record", allowed) and not _reaches("vmsandbox.corex", allowed)


INSIDE = ("sandbox", "door")  # the core's packages that front ends call: the API's backend, the servers' gate
# the core's surface: its top-level modules, and its packages but those the surface rule holds (views/: a review
# as every front end shows it, with who made each change, views/madeby.py)
SURFACE = tuple(
    f"vmsandbox.core.{p.stem}"
    for p in sorted((PACKAGE / "core").iterdir())
    if (p.suffix == ".py" and p.stem != "__init__") or ((p / "__init__.py").is_file() and p.name not in INSIDE)
)


def _past_the_surface(path: Path, inside: str) -> list[str]:
    """What a module of core/`inside` imports that is neither the core's surface (its top-level modules), its own
    package, nor the foundation."""
    allowed = (*SURFACE, f"vmsandbox.core.{inside}", *FOUNDATION)
    return [m for m in _imports(path) if m != "vmsandbox.core" and not _reaches(m, allowed)]


def test_the_apis_side_of_the_core_reaches_only_the_cores_surface() -> None:
    """core/sandbox (the API's backend) and core/door (the gate before the page's and the API's server) reach
    sessions as every front end does: through the core's own functions (sessions, moments, reviews, views,
    listing, watch, ...) and the foundation, never a session, sync, egress, image, guest or VM module, so a rule
    about a session written once in the core holds for the API too. Function-local imports count."""
    wrong = []
    for inside in INSIDE:
        for path in (PACKAGE / "core" / inside).rglob("*.py"):
            wrong += [f"{path.relative_to(PACKAGE)} imports {m}" for m in _past_the_surface(path, inside)]
    assert wrong == []


def test_the_surface_rule_finds_a_reach_past_it(tmp_path: Path) -> None:
    module = tmp_path / "backend.py"
    module.write_text(
        "from vmsandbox.core import sessions, views\n"
        "from vmsandbox.core.sandbox import model\n"
        "from vmsandbox.session import lock\n"
        "def pause():\n"
        "    from vmsandbox.guest.ssh import Endpoint\n"
        "    from vmsandbox.core.door import gate\n"
    )
    assert "vmsandbox.core.sessions" in SURFACE and "vmsandbox.core.sandbox" not in SURFACE
    assert _past_the_surface(module, "sandbox") == [
        "vmsandbox.session", "vmsandbox.session.lock", "vmsandbox.guest.ssh", "vmsandbox.guest.ssh.Endpoint",
        "vmsandbox.core.door", "vmsandbox.core.door.gate",
    ]  # fmt: skip


# Sizes are a smell to look at, not a wall to squeeze under. A folder, module or function at or past its soft mark
# is reported (a warning in pytest's summary, largest first) for a person to look at: code that lands at exactly a
# mark asks for a change of design (a concern of its own, a folder of its own), never for a squeeze under it (a cap
# of 12 modules once pushed sudo.py out of the foundation and into confine/, and paths.py then imported upward).
# The walls stand where nothing of one concern goes, twice the marks: past them a test fails.
SOFT = {"folder": 12, "module": 400, "function": 60}  # modules beside a folder's sub-packages; lines; lines
WALL = {kind: 2 * mark for kind, mark in SOFT.items()}


def _sizes(package: Path) -> list[tuple[str, str, int]]:
    """(kind, what, size) of every folder, module and function under `package`."""
    found = []
    for folder in [package, *(p for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        modules = [m for m in folder.glob("*.py") if m.name != "__init__.py"]
        found.append(("folder", f"{folder.relative_to(package)}/", len(modules)))
    for path in package.rglob("*.py"):
        text = path.read_text()
        found.append(("module", str(path.relative_to(package)), text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                found.append(
                    ("function", f"{path.relative_to(package)}:{node.name}", node.end_lineno - node.lineno + 1)
                )
    return found


def _past(found: list[tuple[str, str, int]], marks: dict[str, int]) -> list[str]:
    """What is at or past its mark, largest first (against its mark)."""
    over = sorted((f for f in found if f[2] >= marks[f[0]]), key=lambda f: (-f[2] / marks[f[0]], f[1]))
    return [
        f"{what} ({size} {'modules' if kind == 'folder' else 'lines'}, mark {marks[kind]})" for kind, what, size in over
    ]


def test_sizes_past_their_mark_are_reported_and_none_is_past_its_wall() -> None:
    found = _sizes(PACKAGE)
    reported = _past(found, SOFT)
    if reported:
        warnings.warn("sizes to look at: " + "; ".join(reported), stacklevel=1)
    walled = [f"{what}: {size}" for kind, what, size in found if size > WALL[kind]]
    assert walled == []


def test_the_size_report_finds_a_wide_folder_and_a_long_function(tmp_path: Path) -> None:
    for i in range(SOFT["folder"]):
        (tmp_path / f"m{i}.py").write_text("x = 1\n")
    (tmp_path / "long.py").write_text("def f() -> None:\n" + "    pass\n" * (SOFT["function"] - 1))
    reported = _past(_sizes(tmp_path), SOFT)
    assert reported == [f"./ (13 modules, mark {SOFT['folder']})", f"long.py:f (60 lines, mark {SOFT['function']})"]


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


def test_the_benchmarks_reach_libvirt_through_the_adapter_too() -> None:
    """bench/ runs beside the package and measures it: its domains are looked at through vm/virt.py's
    Hypervisor, so a change of how libvirt is called is made (and tested) in one place."""
    importers = set()
    for path in (PACKAGE.parent / "bench").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            else:
                continue
            if "libvirt" in names:
                importers.add(path.name)
    assert importers == set()


def test_python_is_started_only_isolated_and_only_by_proc() -> None:
    """vmsandbox starts its own modules as programs (daemons, teardown, the holder of a memory file, jailed
    readers) only through proc.own_module: `-I`, so a project's `ctypes.py` in the working directory is never
    imported by a process that starts as root (issue 48's audit found the cwd on four such paths)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            named = isinstance(node, ast.Attribute) and node.attr == "executable"
            if named and isinstance(node.value, ast.Name) and node.value.id == "sys":  # type: ignore[attr-defined]
                found.append(str(path.relative_to(PACKAGE)))
    assert set(found) == {"proc.py"}, found


def test_no_test_switch_in_the_product() -> None:
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "VMSANDBOX_TEST" in p.read_text() and p.name != "failpoint.py"
    ]
    assert offenders == []


# The tools that parse guest bytes on the host. Each call that starts one names a jail (jail.py), but for the
# calls listed here, which never see guest data: mkfs/debugfs on our own fresh images, the host user's git config.
GUEST_DATA_TOOLS = {"e2fsck", "debugfs", "git", "rsync"}
NEVER_GUEST_DATA = {("vm/ext4.py", "remove_dir"), ("guest/bootfiles.py", "git_identity")}


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
    """e2fsck, debugfs, git and rsync are started only with `jail=` (git through sync.git's Repository.run, which
    jails)."""
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Every module of the package and the modules it imports, wherever the import is written: at the top, in a
    function, under TYPE_CHECKING (a cycle hidden behind a function-local import is still a cycle)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vmsandbox"):
                # `from pkg import module` imports the module; `from module import name`, the module
                found |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
        graph[name] = found - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_not_even_hidden_in_a_function() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


TESTS = PACKAGE.parent / "tests"


def _renaming_imports(path: Path, ours: set[str]) -> list[str]:
    """The imports in `path` that bind a module of ours to a name not its own (`from vmsandbox.sync.tree import
    manifest as tree`, `import vmsandbox.proc as run`), wherever they are written. A class or a function imported
    under another name is not one (a module is known by one name; a name in it may be shown as another)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [
                f"from {node.module} import {a.name} as {a.asname}"
                for a in node.names
                if a.asname not in (None, a.name) and f"{node.module}.{a.name}" in ours
            ]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name} as {a.asname}" for a in node.names if a.asname and a.name in ours]
    return found


def test_a_module_of_ours_is_imported_by_its_own_name() -> None:
    """`from vmsandbox.session import settings`, then `settings.load()`: never `settings as config`, in the
    package or its tests, so that a module is known by one name everywhere (a local that would take its name is
    the one renamed)."""
    files = [*PACKAGE.rglob("*.py"), *TESTS.rglob("*.py")]
    ours = {_module_name(p) for p in files}
    wrong = [f"{p.relative_to(PACKAGE.parent)}: {i}" for p in files for i in _renaming_imports(p, ours)]
    assert wrong == []


def test_the_renaming_import_finder_finds_one(tmp_path: Path) -> None:
    ours = {"vmsandbox.sync.tree.manifest", "vmsandbox.proc"}
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os as system\n"  # not ours
        "import vmsandbox.proc as run\n"
        "from vmsandbox.sync.tree import manifest\n"
        "from vmsandbox.sync.tree import manifest as tree\n"
        "from vmsandbox.sync.tree.manifest import Tree as Files\n"  # a name in a module, not a module
        "def f() -> None:\n"
        "    from vmsandbox.sync.tree import manifest as listing\n"
    )
    assert sorted(_renaming_imports(sample, ours)) == [
        "from vmsandbox.sync.tree import manifest as listing",
        "from vmsandbox.sync.tree import manifest as tree",
        "import vmsandbox.proc as run",
    ]


# Where a VM lives: session.place.interface holds the interfaces (Host and VM, and what they reach), session.place.local
# and .remote their implementations, session.place.common what those do the same way, session.place.choose the one
# chooser. The implementations stand on these modules only (data and helpers that know nothing of policy); policy
# reaches them through the chooser alone.
PLACES = ("vmsandbox.session.place.local", "vmsandbox.session.place.remote")
CHOOSER = "vmsandbox.session.place.choose"
GROUND = {"vmsandbox.session.record", "vmsandbox.session.recordfile"} | {  # (a record, and the file it is kept in)
    f"vmsandbox.session.place.{m}"
    for m in ("interface", "common", "checkpoints", "templates", "console", "chain", "pins", "hostspec", "room")
}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_a_place_stands_on_the_ground_only_and_never_on_another_place() -> None:
    wrong = []
    for name, deps in _graph().items():
        own = next((p for p in PLACES if _in(name, p)), None)
        if own is None and name not in GROUND:
            continue
        for dep in deps:
            if not _in(dep, "vmsandbox.session") or _in(dep, own or "-") or dep in GROUND:
                continue
            wrong.append(f"{name} imports {dep}")
    assert wrong == []


def test_policy_reaches_a_place_only_through_the_chooser() -> None:
    wrong = [
        f"{name} imports {dep}"
        for name, deps in _graph().items()
        if name != CHOOSER and not any(_in(name, p) for p in PLACES)
        for dep in deps
        if any(_in(dep, p) for p in PLACES)
    ]
    assert wrong == []


INTERFACE = PACKAGE / "session" / "place" / "interface.py"
COMMON = PACKAGE / "session" / "place" / "common.py"
INTERFACES = ("Host", "Images", "Facts", "VM", "Saved", "Snapshots", "Forks")
WIDEST = 9  # public methods (properties too) of one place interface: a Host's connection and sessions, and the two
# it reaches (images, facts); one concern each, as lima's driver is built of Lifecycle, Snapshots, GuestAgent
BINDS = {("Host", "vm"), ("Host", "boot"), ("Forks", "copy_disks"), ("Forks", "restore")}


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _public(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    return [f for f in cls.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")]


def _abstract(f: ast.FunctionDef) -> bool:
    return any(ast.unparse(d) == "abc.abstractmethod" for d in f.decorator_list)


def test_the_interface_module_holds_only_the_contract() -> None:
    """interface.py has no function and no method with a body (but a binding `__init__`, which keeps what it is
    given): what the places share is common.py's. Every abstract class of it is one of INTERFACES."""
    tree = ast.parse(INTERFACE.read_text())
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == []
    bodies = []
    for cls in _classes(tree).values():
        if "abc.ABC" in {ast.unparse(b) for b in cls.bases}:
            assert cls.name in INTERFACES
        for f in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            binds = f.name == "__init__" and all(isinstance(s, ast.Assign) for s in f.body)
            declared = _abstract(f) or ast.unparse(f.body[-1]) == "..."  # (a Protocol's)
            if not (binds or declared):
                bodies.append(f"{cls.name}.{f.name}")
    assert bodies == []


def test_the_place_interfaces_stay_small_and_take_no_record_they_bound() -> None:
    """Each interface has a few methods, one concern; a VM and what it reaches are bound to the session's record
    when made, so none of their methods takes one (but a fork's, which is another session's), and a Host takes
    one only to bind it (its VM, a boot)."""
    found = _classes(ast.parse(INTERFACE.read_text()))
    wide = {name: len(_public(found[name])) for name in INTERFACES if len(_public(found[name])) > WIDEST}
    assert wide == {}
    taking = [
        f"{name}.{f.name}({a.arg})"
        for name in INTERFACES
        for f in _public(found[name])
        for a in f.args.args
        if a.annotation is not None and ast.unparse(a.annotation) == "Record" and (name, f.name) not in BINDS
    ]
    assert taking == []


def test_a_place_adds_no_public_method_its_interface_lacks() -> None:
    """Policy reaches a place through its interface only: an implementation's public methods, and those of what it
    mixes in from common.py, are the interface's."""
    interface = {name: {f.name for f in _public(c)} for name, c in _classes(ast.parse(INTERFACE.read_text())).items()}
    mixins = _classes(ast.parse(COMMON.read_text()))
    extra, implemented = [], set()
    for path in PACKAGE.rglob("*.py"):
        if not any(_in(_module_name(path), p) for p in PLACES):
            continue
        for cls in _classes(ast.parse(path.read_text())).values():
            names = {ast.unparse(b) for b in cls.bases}
            methods = [*_public(cls), *(f for m in names & set(mixins) for f in _public(mixins[m]))]
            for base in names & set(INTERFACES):
                implemented.add(base)
                extra += [f"{cls.name}.{f.name}" for f in methods if f.name not in interface[base]]
    assert extra == []
    assert implemented == set(INTERFACES)  # (the walk finds the implementations)


def _bindings(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, set[str]]:
    """The names a function binds to a session's VM (`v = x.vm(r)`, `with places.vm_of(r) as v`), each with the
    record names it is bound to. (A Host is bound to a host, not to a session: `host_of(r)` binds no record.)"""
    bound: dict[str, set[str]] = {}
    for node in ast.walk(func):
        pairs: list[tuple[ast.expr | None, ast.expr]] = []
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            pairs.append((node.targets[0], node.value))
        elif isinstance(node, ast.With):
            pairs += [(item.optional_vars, item.context_expr) for item in node.items]
        for target, value in pairs:
            if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
                continue
            if isinstance(value.func, ast.Attribute) and value.func.attr in ("vm", "vm_of"):
                bound[target.id] = {a.id for a in value.args if isinstance(a, ast.Name)}
    return bound


def _bound_in(receiver: ast.expr, bound: dict[str, set[str]]) -> set[str]:
    """The record names a call's receiver is bound to: through a bound name, or a binding call in it."""
    names: set[str] = set()
    for part in ast.walk(receiver):
        if isinstance(part, ast.Name):
            names |= bound.get(part.id, set())
        if isinstance(part, ast.Call) and isinstance(part.func, ast.Attribute) and part.func.attr != "load":
            names |= {a.id for a in part.args if isinstance(a, ast.Name)}
    return names


def _rebound(tree: ast.AST, methods: set[str]) -> list[str]:
    """Calls of a place method that pass a record its receiver is bound to: `x.of(r).m(r)`, `v.m(r)` after
    `v = x.vm(r)` or `with places.vm_of(r) as v`, or `m(v.record)`."""
    wrong = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        bound = _bindings(func)
        for node in ast.walk(func):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in methods:
                continue
            names = _bound_in(node.func.value, bound)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                again = isinstance(arg, ast.Name) and arg.id in names
                if again or (isinstance(arg, ast.Attribute) and arg.attr == "record"):
                    wrong.append(f"{func.name}:{node.lineno}: {ast.unparse(node)}")
    return wrong


def _place_methods() -> set[str]:
    found = _classes(ast.parse(INTERFACE.read_text()))
    return {f.name for name in INTERFACES for f in _public(found[name])}


def test_no_record_is_passed_to_a_place_that_holds_it() -> None:
    """Outside the places (and the chooser, which binds them), a place method is never handed the record its VM
    or Snapshots was bound to."""
    methods = _place_methods()
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        if _module_name(path) == CHOOSER or any(_in(_module_name(path), p) for p in PLACES):
            continue
        wrong += [f"{path.relative_to(PACKAGE)}:{w}" for w in _rebound(ast.parse(path.read_text()), methods)]
    assert wrong == []


def test_the_rebinding_finder_finds_a_record_passed_twice() -> None:
    methods = _place_methods()
    passed_twice = """
def a(record):
    places.of(record).saved.take(record, hv)
def b(record):
    with places.vm_of(record) as vm:
        vm.snapshots.drop(record)
def c(host, source):
    vm = host.vm(source)
    vm.saved.restore(vm.record)
"""
    assert len(_rebound(ast.parse(passed_twice), methods)) == 3
    bound_once = """
def d(host, source, fork):
    vm = host.vm(source)
    vm.forks.restore(cp, fork)
    host.vm(Record.load(name)).snapshots.drop(cp.label, live=True)
"""
    assert _rebound(ast.parse(bound_once), methods) == []


# The ways code has asked "does this VM live on another host?": a URI's host part, the host's name compared with
# `local`, the --host option compared with None.
WHERE_TESTS = re.compile(
    r"\bis_remote\b|\.hostname\b|\bhost\s*[!=]=\s*(\"local\"|'local'|LOCAL\b)|\b(opts|options)\.host\s+is\s+(not\s+)?None"
)


def test_only_the_chooser_asks_where_a_vm_lives() -> None:
    asking = []
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        if name == CHOOSER or any(_in(name, p) for p in PLACES):
            continue
        if not (_in(name, "vmsandbox.session") or _in(name, "vmsandbox.cli")):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if WHERE_TESTS.search(line):
                asking.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert asking == []
    assert WHERE_TESTS.search('if record.host == "local":') and WHERE_TESTS.search("if opts.host is None:")


def test_no_pattern_lets_a_trailing_newline_through() -> None:
    """A pattern anchored with `$` matches before a final newline (`run --name $'x\\n'` passed as a name): an
    anchored pattern ends in `\\Z`, or is used with fullmatch. Every regular expression literal of the package
    that starts with `^` is held to it (re.MULTILINE ones excepted)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("compile", "match", "search") or not node.args:
                continue
            first = node.args[0]
            multiline = any("MULTILINE" in ast.unparse(a) or ast.unparse(a).endswith(".M") for a in node.args[1:])
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and not multiline:
                text = first.value
                if text.startswith("^") and text.endswith("$") and not text.endswith("\\$"):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {text}")
    assert found == []


def _loaded_at_import(module: str) -> set[str]:
    """What importing `module` loads: the modules its top-level statements import (not those in a function or
    under TYPE_CHECKING), theirs in turn; the package's own by name, others by their first part and as named."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    seen, todo, outside = set(), [module], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        stack = list(ast.parse(modules[name].read_text()).body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                stack += node.orelse
            elif isinstance(node, ast.If | ast.Try):
                stack += [*node.body, *node.orelse, *getattr(node, "finalbody", []), *getattr(node, "handlers", [])]
            elif isinstance(node, ast.ExceptHandler):
                stack += node.body
            elif isinstance(node, ast.Import | ast.ImportFrom):
                module_names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.module:
                    module_names += [f"{node.module}.{a.name}" for a in node.names]
                for m in module_names:
                    if m in modules:
                        todo.append(m)
                    elif not m.startswith("vmsandbox"):
                        outside |= {m.split(".")[0], m}
    return outside | seen


def test_a_sessions_own_processes_load_no_config_models_libvirt_or_rich() -> None:
    """Every session runs an egress daemon for its life (and a remote one a tunnel supervisor): what they import
    is memory of their own in each (a hundred idle sessions: a hundred daemons). Config models (pydantic) and
    YAML cost a daemon ~8 MiB of its own, libvirt's module 3 MiB (never used once it dropped root), rich 2 MiB
    (a daemon prints nothing; ui's consoles are made at their first use): each is imported where it is used."""
    for module in ("vmsandbox.egress.daemon", "vmsandbox.session.place.remote.tunnel"):
        loaded = _loaded_at_import(module)
        assert "os" in loaded, module  # (the walk finds what it should)
        assert loaded & {"pydantic", "yaml", "libvirt", "typer", "starlette", "rich"} == set(), module


def test_every_command_starts_without_the_config_models_libvirt_or_typers_help_printer() -> None:
    """Every command, and every word a shell's TAB completes, first imports the CLI and its command modules. What
    only some commands use is imported where they use it: the config models (pydantic, yaml: `run` reads them),
    libvirt, paramiko, cryptography (a session's CA), typer's help printer (markdown and pretty tracebacks: `-h`).
    With them at the top, the import took 250 ms of an `exec -- true` that took 600; without, 70."""
    heavy = {"pydantic", "yaml", "cryptography", "libvirt", "paramiko", "typer.rich_utils", "rich.markdown"}
    loaded = _loaded_at_import("vmsandbox.cli.main")
    assert "typer" in loaded and "rich" in loaded  # (the walk finds what it should)
    assert loaded & heavy == set()
    assert _loaded_at_import("vmsandbox.core.commandlog") & heavy == set()  # the log every command opens first


def test_what_asks_how_a_session_is_imports_no_cryptography() -> None:
    """`ls`, `exec`, `shell`, `cp` ask how a session is (session/state.py); only making a session's CA needs
    cryptography (~30 ms to import)."""
    assert "cryptography" not in _loaded_at_import("vmsandbox.session.state")


def test_what_runs_a_command_in_a_session_imports_no_review_make_or_fork() -> None:
    """`exec`, `shell`, `cp` and `ls` reach a session through core/sessions.py; what makes, forks, stops, ends or
    reviews one is imported by the function that does it (28 ms of each such command's start here)."""
    loaded = _loaded_at_import("vmsandbox.core.sessions")
    assert "vmsandbox.session.state" in loaded  # (the walk finds what it should)
    heavy = {"vmsandbox.core.flow", "vmsandbox.core.reviews", "vmsandbox.session.start.create"}
    heavy |= {"vmsandbox.sync.review.gather", "vmsandbox.session.moments.fork", "vmsandbox.session.end.lifecycle"}
    assert loaded & heavy == set()
