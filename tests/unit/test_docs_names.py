"""Every name of ours that the docs give exists: each dotted name (`vmsandbox.sync.review.risk`, `session.record.Record`
written from the package, `failpoint.hit`, `Record.overlays`), file name (`paths.py`, `sync/fetch/volume.py`) and
test (`test_dependencies_point_one_way`) in README.md, the pages under docs/ and the package's docstrings
(`__init__.py` files' lists of modules included). CHANGELOG.md is history: it may name what is gone.

A dotted name is ours when its first word is `vmsandbox`, one of the package's modules or sub-packages (by its last
name: `place.local.start`, `lifecycle.destroy`), one of its classes or a name a module went by before (FORMER); it
resolves when importing a module it may mean and getting the attributes works (a class's fields and `self.`
attributes count, and `record.x` may mean `Record.x`). A file name resolves when a file of the repository ends with
it. Not names: what the code writes as a string (`memory.ram`, the fail point `run.boot`), file and host names
(`session.json.copy`, `api.anthropic.com`), a function's own parameters in its docstring (`cp.path`), examples'
code (a fenced block with a language), and the few in NOT_OURS. A failure lists each stale name with its file and
line."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vmsandbox"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TREES = ("vmsandbox", "tests", "bench", "docs", "images")  # where a file a page names may be

# A dotted word: not part of a longer one, an address or a path (`https://x.y`, `/etc/x.conf`, `.vmsandbox.yaml`).
DOTTED = re.compile(r"(?<![\w./\-$@:])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/\-]|\.\w)")
# A file name of Python: `paths.py`, `sync/fetch/volume.py`, `tests/unit/test_docs.py`.
PYTHON_FILE = re.compile(r"(?<![\w./\-$@:])((?:[\w-]+/)*[\w-]+\.py)(?![\w/\-]|\.\w)")
# A test named by its function: `test_dependencies_point_one_way`.
TEST = re.compile(r"(?<![\w./\-$@:])(test_\w+)(?![\w/\-*]|\.\w)")
# Words after a dot that make a file name or a host name, not a name of Python.
SUFFIXES = frozenset({
    "py", "md", "c", "h", "sh", "js", "ts", "html", "css", "png", "svg", "txt", "log", "json", "yaml", "yml", "toml",
    "xml", "conf", "ini", "img", "qcow2", "raw", "iso", "bundle", "patch", "io", "com", "org", "net", "app", "dev",
})  # fmt: skip
# Names our modules went by before each had one (import aliases, older module names): a word that starts with one
# is ours, and stale (`places.host` is `choose.host`).
FORMER = frozenset({
    "places", "templatekey", "commitfetch", "commitreview", "commits", "layerbuild", "inbound", "reviewable",
    "memsplit", "secretstore", "proxylog", "projecttrust", "hostlist", "sessions_of", "forking", "copying",
    "pushing", "creating", "admission", "transfer", "accel_mod", "blueprint_mod", "boot_mod", "checkpoints_mod",
    "hunks_mod",
})  # fmt: skip
FENCE = re.compile(r"^\s*(```|~~~)\s*(\S*)")
NOT_OURS = {  # words that look like ours and are not
    "api.DOMAIN": "docs/api.md: a host name under the API's domain",
    "project.urls": "docs/development.md: pyproject.toml's table",
    "calc.py": "docs/api.md: the example's file in a sandbox",
    "ctypes.py": "a project's file that Python would import first",
    "signal.py": "a project's file that Python would import first",
    "manage.py": "a project's file (Django's), in an example",
    "kernel.randomize_va_space": "vm/domain.py: the guest kernel's setting",
}


@cache
def modules() -> dict[str, Path]:
    """Each module and package of vmsandbox by its dotted name, from the files (`__main__` runs: not a name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] != "__main__":
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def by_last_name() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name in sorted(modules()):
        found.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return found


@cache
def classes() -> dict[str, list[str]]:
    """Each class a module of vmsandbox defines at its top, by name: the modules that define one of that name."""
    found: dict[str, list[str]] = {}
    for name, path in sorted(modules().items()):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(name)
    return found


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _documented(tree: ast.Module) -> list[ast.AST]:
    """The module and each class and function of it that has a docstring."""
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef))]
    return [n for n in nodes if ast.get_docstring(n) is not None]


def _docstring(node: ast.AST) -> ast.Constant:
    first = node.body[0]  # type: ignore[attr-defined]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return first.value


@cache
def literals() -> frozenset[str]:
    """The dotted words the code writes in its strings (not its docstrings): file names, fail points, a QEMU id."""
    found: set[str] = set()
    for path in modules().values():
        tree = _tree(path)
        docstrings = {id(_docstring(n)) for n in _documented(tree)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found.update(DOTTED.findall(node.value))
    return frozenset(found)


@cache
def defined_in_tests() -> frozenset[str]:
    """The functions defined under tests/ (each test, and what a test calls)."""
    return frozenset(
        node.name
        for path in (ROOT / "tests").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


@cache
def repository_files() -> tuple[str, ...]:
    return tuple(
        "/" + str(p.relative_to(ROOT))
        for tree in TREES
        for p in (ROOT / tree).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


class Line(NamedTuple):
    """A line a name of ours may be written in: where, its number, its text; the words that name no module there (a
    function's parameters: `cp.path` in its docstring is its argument's); for an `__init__` file, its package, whose
    list of modules its bare file names are."""

    where: str
    n: int
    text: str
    local: frozenset[str] = frozenset()
    home: str = ""


def _markdown(page: Path) -> Iterator[Line]:
    """A page's lines but those of fenced blocks with a language (an example's code, a shell session)."""
    language = None
    for n, line in enumerate(page.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            language = None if language is not None else fence.group(2)
        elif not language:
            yield Line(str(page.relative_to(ROOT) if page.is_relative_to(ROOT) else page), n, line)


def _docstrings(path: Path) -> Iterator[Line]:
    """The lines of a module's docstrings (its own, its classes' and its functions'), numbered as in the file."""
    where = str(path.relative_to(ROOT))
    home = "/" + str(path.parent.relative_to(ROOT)) + "/" if path.name == "__init__.py" else ""
    for node in sorted(_documented(_tree(path)), key=lambda n: _docstring(n).lineno):
        args = node.args if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None
        local = frozenset(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]) if args else frozenset()
        doc = _docstring(node)
        for i, line in enumerate(str(doc.value).splitlines()):
            yield Line(where, doc.lineno + i, line, local, home if node is _tree(path) else "")


def texts() -> Iterator[Line]:
    """Every line a name of ours may be written in."""
    for page in PAGES:
        yield from _markdown(page)
    for path in sorted(PACKAGE.rglob("*.py")):
        yield from _docstrings(path)


def _has(owner: Any, name: str) -> bool:
    if hasattr(owner, name):
        return True
    if not inspect.isclass(owner):
        return False
    for cls in owner.__mro__:
        if name in getattr(cls, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(name)}\s*(:|=[^=])", source):
            return True
    return False


def _resolves(dotted: str) -> bool:
    """Import the longest module the name starts with, then get each attribute after it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules():
            owner: Any = importlib.import_module(".".join(parts[:i]))
            for attribute in parts[i:]:
                if not _has(owner, attribute):
                    return False
                owner = getattr(owner, attribute, None)
            return True
    return False


def meanings(word: str) -> list[str]:
    """The names of vmsandbox a dotted word may mean: itself, itself under the package, each module of its first
    name with the rest, each class of its first name (`Record.overlays`), and a module's class of that name in
    another case (`record.overlays`). Empty: not a word of ours."""
    first, _, rest = word.partition(".")
    if first == "vmsandbox":
        return [word]
    found = [f"{m}.{rest}" for m in by_last_name().get(first, [])]
    found += [f"{m}.{word}" for m in classes().get(first, [])]
    found += [f"{m}.{c}.{rest}" for m in by_last_name().get(first, []) for c in classes() if c.lower() == first]
    return found


def _not_python(word: str) -> bool:
    """A file or host name (`session.json.copy`, `api.anthropic.com`), a setting of another program in its own case
    (git's `core.hooksPath`), or a word the code writes as a string (`memory.ram`, the fail point `run.boot`)."""
    rest = word.split(".")[1:]
    return bool(SUFFIXES & set(rest)) or any(re.search(r"^[a-z].*[A-Z]", w) for w in rest) or word in literals()


def _is_file(name: str, home: str) -> bool:
    return any(f.endswith("/" + name) and f.startswith(home) for f in repository_files())


def stale_names(lines: Iterable[Line]) -> list[str]:
    """`FILE:LINE: `NAME`: no such name` (file, test) for each name of ours in the lines that does not exist."""
    wrong = []
    for line in lines:
        for word in DOTTED.findall(line.text):
            if word in NOT_OURS or word.split(".")[0] in line.local or _not_python(word):
                continue
            found = meanings(word)
            if (found or word.split(".")[0] in FORMER) and not any(map(_resolves, found)):
                wrong.append(f"{line.where}:{line.n}: `{word}`: no such name")
        for name in PYTHON_FILE.findall(line.text):
            ours = "/" not in name or name.split("/")[0] in (*TREES, *by_last_name())
            if ours and name not in NOT_OURS and not _is_file(name, "" if "/" in name else line.home):
                wrong.append(f"{line.where}:{line.n}: `{name}`: no such file")
        wrong += [
            f"{line.where}:{line.n}: `{name}`: no such test"
            for name in TEST.findall(line.text)
            if name not in defined_in_tests()
        ]
    return wrong


def test_every_name_and_file_of_ours_the_docs_give_exists() -> None:
    stale = stale_names(texts())
    assert not stale, "names in the docs that do not exist (fix each to the name it has now):\n" + "\n".join(stale)


def test_the_finder_finds_stale_names_and_lets_the_rest_be(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "`sync.risk.RISKY_PATTERNS` (now `sync.review.risk.RISKY_PATTERNS`), `vmsandbox.session.suspend` and\n"
        "`failpoint.hit` `failpoint.miss()` `Record.overlays` `Record.nothing` `record.memory_note` `cp.path`\n"
        "`vm.memory.usage.reserved_mib` (usage.reserved_mib) `errors.VmsandboxError.hint` `paths.py` `gone.py`\n"
        "`places.host(spec)` `templatekey.condemns` `choose.host`\n"
        "`test_dependencies_point_one_way`, `test_api_*.py`, `test_nothing_of_the_kind` and test_docs_names.py\n"
        "`sync/fetch/volume.py` `sync/fetch/gone.py` `tests/unit/test_docs.py` `src/main.py` https://vmsandbox.x/a.b\n"
        "e.g. i.e. `os.path.join` `memory.ram` `run.boot` `session.json.copy` `mkfs.ext4` `api.anthropic.com`\n"
        "git's `core.hooksPath`\n"
        "```python\nsbx = api.post(proc.nothing)\n```\n"
        "```\ncore.flow.run ──► core.flow.nowhere\n```\n"
    )
    lines = [*_markdown(page)]
    lines += [Line("f.py", 1, "`cp.path`, cp.nothing", local=frozenset({"cp"}))]
    lines += [Line("vmsandbox/vm/__init__.py", 2, "virt.py, proc.py, memory/hold.py", home="/vmsandbox/vm/")]
    found = [w.split(": ", 1)[1] for w in stale_names(lines)]
    assert found == [
        "`sync.risk.RISKY_PATTERNS`: no such name",
        "`vmsandbox.session.suspend`: no such name",
        "`failpoint.miss`: no such name",
        "`Record.nothing`: no such name",
        "`cp.path`: no such name",
        "`gone.py`: no such file",
        "`places.host`: no such name",
        "`templatekey.condemns`: no such name",
        "`test_nothing_of_the_kind`: no such test",
        "`sync/fetch/gone.py`: no such file",
        "`core.flow.nowhere`: no such name",
        "`proc.py`: no such file",
    ]
    assert stale_names(_markdown(page))[0].startswith(f"{page}:1: ")
