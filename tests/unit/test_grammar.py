"""The one grammar (issue 46): everyday verbs at the top and nouns with verbs, in panels; help a person reads;
listings as docker and limactl print them (tables that fit, --format, --filter); completion of every finite value
through bash's own protocol."""

from __future__ import annotations

import inspect
import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main

from tests.unit.conftest import saved_record
from tests.unit.test_cli import run_cli
from vmsandbox import paths
from vmsandbox.cli import base, helptext, output
from vmsandbox.cli.sessions import logs
from vmsandbox.errors import UsageError

NOUNS = {
    "checkpoint": {"create", "ls", "rm", "restore"},
    "port": {"ls", "publish", "rm"},
    "policy": {"allow", "deny", "ls", "log"},
    "host": {"ls", "add", "rm", "setup", "prepare"},
    "image": {"build", "ls", "show", "rm"},
    "secret": {"set", "ls", "rm", "wipe"},
    "login": {"add", "ls", "rm"},
    "config": {"show", "validate", "schema", "trust"},
    "config trust": {"add", "ls", "rm"},
}


def all_commands() -> list[tuple[str, Any]]:
    def walk(cmd: Any, prefix: str) -> Any:
        for name in cmd.list_commands(None):
            sub = cmd.get_command(typer.Context(cmd), name)
            yield prefix + name, sub
            if hasattr(sub, "commands"):
                yield from walk(sub, prefix + name + " ")

    return list(walk(typer.main.get_command(base.app), ""))


def top_rows(out: str) -> list[list[str]]:
    """The rows of `vmsandbox -h`'s command panels as a terminal shows them, each the names it shows (`claude,`
    over `codex,`: one row)."""
    rows: list[list[str]] = []
    joined = False
    for found in re.finditer(r"^│ (\S*)", out[out.index("╭─ Start") :], re.MULTILINE):
        name = found.group(1)
        if not name:
            continue  # a summary's second line
        if joined:
            rows[-1].append(name.rstrip(","))
        else:
            rows.append([name.rstrip(",")])
        joined = name.endswith(",")
    return rows


@pytest.fixture(autouse=True)
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Help as a pipe reads it (stdout is capsys's), whatever FORCE_COLOR or GITHUB_ACTIONS say where it runs."""
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "FORCE_TERMINAL", None)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Help as a terminal of 80 columns shows it, without colour (the panels' text as it is)."""
    from typer import rich_utils

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(rich_utils, "FORCE_TERMINAL", True)
    monkeypatch.setattr(rich_utils, "COLOR_SYSTEM", None)


def plain_rows(out: str) -> dict[str, list[str]]:
    """The panels of `vmsandbox -h` piped (`Start:`, then `  run  Run COMMAND…`), each its rows' names."""
    panels: dict[str, list[str]] = {}
    for block in out.split("\n\n"):
        head, *rows = block.splitlines()
        if head.endswith(":") and head != "Examples:" and rows and rows[0].startswith("  "):
            panels[head[:-1]] = [r[2:].split("  ")[0] for r in rows if r[2:3] != " "]
    return panels


def test_the_top_lists_about_25_names_each_in_one_panel_and_every_noun_its_verbs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    top = typer.main.get_command(base.app)
    paneled = [n for names in base.PANELS.values() for n in names]
    shown = [n for n, c in top.commands.items() if not c.hidden]  # type: ignore[attr-defined]
    assert sorted(paneled) == sorted(shown)  # every command not hidden in one panel
    in_rows = len(paneled) - sum(len(names) - 1 for names in base.ROWS)  # (the agents are one row of the help)
    assert len(paneled) == len(set(paneled)) and in_rows <= 30
    hidden = {n for n, c in top.commands.items() if c.hidden}  # type: ignore[attr-defined]
    assert hidden == {"help", "version"}  # (-h and --version are in the Options panel)
    for noun, verbs in NOUNS.items():
        group: Any = top
        for word in noun.split(" "):
            group = group.commands[word]
        assert set(group.commands) == verbs, noun
        assert all(v in group.help.split("\n\n")[0] for v in verbs), noun
    assert run_cli(["--help"]) == 0
    out = capsys.readouterr().out
    panels = plain_rows(out)
    assert list(panels) == ["Options", *base.PANELS]
    rows = [row for name in base.PANELS for row in panels[name]]
    assert len(rows) <= 28  # (27 until `mcp`, the fourth front end)
    assert [r.split(", ") for r in rows if "," in r] == [list(base.AGENTS)]  # one row, its summary the agents'
    assert [n for r in rows for n in r.split(", ")] == paneled  # in the panels' order, nothing else (no alias)
    assert "Run that agent in a disposable VM" in out
    for old in ("destroy", "rollback", "checkpoints", "fork", "fanout", "compare", "recover", "gc", "hosts"):
        assert old not in paneled
    assert "vmsandbox help COMMAND" in out.strip().splitlines()[-1]  # the last line names `help`


@pytest.mark.usefixtures("terminal")
def test_at_a_terminal_the_top_help_keeps_its_panels(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--help"]) == 0
    out = capsys.readouterr().out
    rows = top_rows(out)
    paneled = [n for names in base.PANELS.values() for n in names]
    assert [n for row in rows for n in row] == paneled  # in the panels' order, nothing else (no alias, no hidden)
    assert ["claude", "codex", "gemini", "opencode"] in rows  # one row, its summary the agents'
    assert "│ opencode " in out and all(len(line) <= 80 for line in out.splitlines())
    assert run_cli(["ui", "-h"]) == 0
    port = next(line for line in capsys.readouterr().out.splitlines() if "--port" in line)
    assert port.count("[default:") == 1  # said by the help, not again by typer


def test_the_top_help_honours_no_color(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its rows too are printed by typer's console: styled on a terminal, not at all under NO_COLOR (where help is
    plain text)."""
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "FORCE_TERMINAL", True)  # as a terminal shows it
    for no_color, styled in (("", True), ("1", False)):
        monkeypatch.setenv("NO_COLOR", no_color)
        assert run_cli(["-h"]) == 0
        out = capsys.readouterr().out
        assert ("\x1b[" in out) is styled, no_color
        assert ("╭" in out) is styled and "opencode" in out and "completion" in out


BOX = set("╭╮╰╯│─┌┐└┘├┤")


def test_help_piped_is_plain_text_that_pastes(capsys: pytest.CaptureFixture[str]) -> None:
    """Every command's and group's help piped: no box, no padding, no trailing space, no markup shown as it is
    written (backticks, `\\[`), each default said once, each example one line that runs as it is (a note after it
    is a shell comment)."""
    for name, _command in [("", None), *all_commands()]:
        argv = [*name.split(" "), "-h"] if name else ["-h"]
        assert run_cli(argv) == 0, name
        out = capsys.readouterr().out
        assert out.startswith(f"Usage: {' '.join(['vmsandbox', *argv[:-1]])} "), name
        assert not BOX & set(out), name
        assert [line for line in out.splitlines() if line != line.rstrip()] == [], name
        assert "`" not in out and "\\[" not in out, name
        assert all(line.count("[default:") <= 1 for line in out.splitlines()), name
        _, _, examples = out.partition("\nExample")
        assert examples, f"{name}: no example"
        for line in examples.split("\n\n")[0].splitlines()[1:]:
            assert line.startswith("  ") and "vmsandbox " in line, f"{name}: {line!r}"
            shlex.split(line.split("  # ")[0])  # one whole command line, quotes closed
        command = _command or typer.main.get_command(base.app)
        helptext.tidy(command)
        written = str(command.help).split("\n\n")
        for example in written[next(i for i, p in enumerate(written) if helptext.EXAMPLES.fullmatch(p)) + 1 :]:
            assert helptext.EXAMPLE.fullmatch(example), f"{name}: one command an example: {example}"


def test_the_help_of_every_option_with_a_finite_set_lists_it(capsys: pytest.CaptureFixture[str]) -> None:
    """An option whose values are a known set (its completion says which) names each of them in its help."""
    from vmsandbox.cli import complete
    from vmsandbox.core import watch

    sets = {complete.accel: complete.ACCEL, complete.review: complete.REVIEW, complete.shells: complete.SHELLS,
            complete.networks: watch.MODES, complete.formats: complete.FORMATS}  # fmt: skip
    seen = 0
    for name, command in all_commands():
        for param in command.params:
            values = sets.get(_completion_of(param))
            if name == "inspect" and values == complete.FORMATS:
                values = ("json", "ssh-config")  # (and a template: one of many, not a table)
            if values is None:
                continue
            seen += 1
            said = f"{param.metavar} {param.help}"
            assert all(v in said for v in values), f"{name} {param.name}: {said}"
    assert seen >= 10


def _completion_of(param: Any) -> Any:
    """The function typer was given as a parameter's autocompletion (its wrappers hold it)."""
    found = [getattr(param, "_custom_shell_complete", None)]
    while found:
        function = found.pop()
        inner = [c.cell_contents for c in getattr(function, "__closure__", None) or () if callable(c.cell_contents)]
        if not inner and getattr(function, "__module__", "") == "vmsandbox.cli.complete":
            return function
        found += inner
    return None


def test_help_a_person_reads(capsys: pytest.CaptureFixture[str]) -> None:
    """Each summary one line of at most 80 characters, never said again as the next paragraph; every command has
    an example; no click type shown where a metavar belongs (`<int range> [x>=0]`)."""
    for name, command in all_commands():
        paragraphs = inspect.cleandoc(command.help or "").split("\n\n")
        first = paragraphs[0]
        assert "\n" not in first and len(first) <= 80, f"{name}: {first!r}"
        if len(paragraphs) > 1:
            again = " ".join(first.split()[:4]).rstrip(".").lower()
            assert not paragraphs[1].lower().startswith(again), f"{name} repeats its first sentence"
        assert "Example" in (command.help or ""), name
        assert run_cli([*name.split(" "), "--help"]) == 0
        out = capsys.readouterr().out
        for leak in ("<bool>", "<list[str]>", "<int", "<float", "<str>", "<path>", "range>", "x>=", "x<="):
            assert leak not in out, f"{name}: {leak}"


def test_run_shows_its_options_in_panels_with_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["run", "-h"]) == 0
    out = capsys.readouterr().out
    panels = re.findall(r"^(\S[^:\n]*):$", out, re.MULTILINE)
    assert panels[:3] == ["Examples", "Arguments", "Options"] and {
        "The VM",
        "Network",
        "Into the guest",
        "The review at the end",
        "Fan-out",
    } <= set(panels)
    flat = " ".join(out.split())
    assert "vCPUs [default: 2" in flat and "[default: 2G]" in flat and "[default: 20G]" in flat
    assert "allowlist: listed hosts only [default]" in flat and "-t, --tty / --no-tty" in flat
    assert "  vmsandbox run --keep --name exp .  # a shell; the session stays for vmsandbox shell exp\n" in out


def test_the_defaults_run_h_names_are_the_settings() -> None:
    """runoptions names them without importing the settings' models (every command would pay for it)."""
    from vmsandbox.cli.sessions import runoptions
    from vmsandbox.core.settings import DEFAULTS

    named = (runoptions.DEFAULT_CPUS, runoptions.DEFAULT_MEMORY_MIB, runoptions.DEFAULT_DISK_MIB)
    assert named == (DEFAULTS.cpus, DEFAULTS.memory_mib, DEFAULTS.disk_mib)


def test_readable_help_joins_lines_and_splits_examples() -> None:
    text = """First line.

    A long sentence cut
    in two.

    Examples: `a` · `b c` (a note)"""
    assert helptext.readable(text) == "First line.\n\nA long sentence cut in two.\n\nExamples:\n\n`a`\n\n`b c` (a note)"
    assert helptext.prose("run `vmsandbox shell exp1` to go in, then `exit`", 20) == [
        "run",
        "vmsandbox shell exp1",
        "to go in, then exit",
    ]  # a command is never cut across lines


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["help", "checkpoint", "restore"]) == 0
    shown = capsys.readouterr().out
    assert run_cli(["checkpoint", "restore", "-h"]) == 0
    assert shown == capsys.readouterr().out
    for noun in (["checkpoint", "help", "restore"], ["help", "checkpoint", "restore"]):  # under a noun too
        assert run_cli(noun) == 0
        assert capsys.readouterr().out == shown, noun
    assert run_cli(["checkpoint", "help"]) == 0  # the noun's help, never a session named help
    noun_help = capsys.readouterr().out
    assert run_cli(["checkpoint", "-h"]) == 0
    assert noun_help == capsys.readouterr().out
    assert run_cli(["config", "trust", "help", "add"]) == 0
    assert "Usage: vmsandbox config trust add" in capsys.readouterr().out
    assert run_cli(["help", "secret", "list"]) == 0  # `list` is `ls`
    assert "Usage: vmsandbox secret ls" in capsys.readouterr().out
    for old in (["rollback"], ["gc"], ["checkpoint", "nope"], ["blueprint", "ls"]):
        assert run_cli(["help", *old]) == base.EXIT_USAGE, old
        captured = capsys.readouterr()
        assert captured.out == "" and "is now" not in captured.err and "hint:" in captured.err, old
    assert run_cli(["help", "version"]) == 0
    assert "Usage: vmsandbox version" in capsys.readouterr().out
    assert run_cli([]) == 0  # bare: the help, exit 0
    assert "Usage: vmsandbox" in capsys.readouterr().out
    assert run_cli(["policy"]) == 0
    assert "allow" in capsys.readouterr().out


def test_version_is_one_line_however_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """`vmsandbox -v` alone is the version, as docker's; `version` and `--version` say it the same way."""
    said = set()
    for argv in (["version"], ["--version"], ["-v"]):
        assert run_cli(argv) == 0
        said.add(capsys.readouterr().out)
    assert len(said) == 1 and re.fullmatch(r"vmsandbox \d+\.\d+\.\d+\n", said.pop())
    assert run_cli(["version", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"version"}
    assert run_cli(["--verbose"]) == 0  # nothing to be verbose about: the help, never silence
    assert capsys.readouterr().out.startswith("Usage: vmsandbox [OPTIONS] COMMAND")


@pytest.mark.usefixtures("isolated_dirs")
def test_a_damaged_record_is_a_row_of_its_own_its_problem_said_apart(capsys: pytest.CaptureFixture[str]) -> None:
    files = paths.session_paths("broken")
    files.root.mkdir(parents=True)
    files.record.write_text(json.dumps(["not", "a", "record"]))
    assert run_cli(["ls"]) == 0
    captured = capsys.readouterr()
    row = next(line for line in captured.out.splitlines() if line.startswith("broken"))
    assert row.split() == ["broken", "damaged", "-", "-", "-", "-", "-", "-", "-"]  # its problem: not in PROJECT
    assert "broken" in captured.err and "Traceback" not in captured.err
    assert run_cli(["ls", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # an object a line
    assert rows[0]["name"] == "broken" and rows[0]["state"] == "damaged" and "rm broken --discard" in rows[0]["hint"]


@pytest.mark.usefixtures("isolated_dirs")
def test_empty_listings_say_what_to_do_next(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.session import state

    monkeypatch.setattr(state, "listing", lambda uri: ([], []))
    for argv, said in (
        (["ls"], "vmsandbox run ."),
        (["ls", "--filter", "state=running"], "`vmsandbox ls` lists them all"),
        (["secret", "ls"], "vmsandbox secret set NAME"),
        (["config", "trust", "ls"], "vmsandbox config trust add PATH"),
        (["login", "ls"], "vmsandbox login add AGENT"),
        (["image", "ls"], "vmsandbox image build"),
    ):
        assert run_cli(argv) == 0
        captured = capsys.readouterr()
        assert captured.out == "" and said in captured.err, argv


@pytest.mark.usefixtures("isolated_dirs")
def test_verbose_says_each_line_once(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from vmsandbox.session import state

    monkeypatch.setattr(state, "listing", lambda uri: ([], []))
    handlers = list(logging.getLogger().handlers)
    try:
        assert run_cli(["ls", "-v"]) == 0  # -v anywhere on the line
        assert capsys.readouterr().err.count("No sessions") == 1
    finally:
        logging.getLogger().handlers = handlers


def test_no_color_means_no_style_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from vmsandbox import ui

    monkeypatch.setenv("FORCE_COLOR", "1")  # as a terminal shows it
    monkeypatch.setenv("TERM", "xterm-256color")
    for value, styled in (("1", False), ("", True)):
        monkeypatch.setenv("NO_COLOR", value)
        console = ui.console(stderr=True)
        console.file = io.StringIO()
        console.print("[dim]hint:[/] [red]x[/]")
        assert ("\x1b[" in console.file.getvalue()) is styled, value


ROW = {"name": "exp-1", "state": "running", "host": "local", "ports": {"ssh": 2222}, "age_seconds": 5, "egress": None}


def test_filters_check_their_keys_and_values() -> None:
    keys: dict[str, Any] = {"name": None, "state": ("running", "stopped"), "host": ("local",)}
    assert output.matches(ROW, output.filters(["state=running,host=local"], keys))
    assert output.matches(ROW, output.filters(["name=exp-*", "state=stopped", "state=running"], keys))
    assert output.matches(ROW, output.filters(["state=run*"], keys))
    assert not output.matches(ROW, output.filters(["state=stopped"], keys))
    refusals = (
        (["bogus=1"], "KEY one of name, state, host"),
        (["state"], "KEY=VALUE"),
        (["state=bogus"], "state is one of running, stopped"),
        (["host=far"], "host is one of local"),
    )
    for bad, said in refusals:
        with pytest.raises(UsageError) as refused:
            output.filters(bad, keys)
        assert said in f"{refused.value.message} {refused.value.hint}", bad


@pytest.mark.usefixtures("isolated_dirs")
def test_ls_refuses_a_format_before_asking_anything(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.session import state

    def asked(uri: str) -> Any:
        raise AssertionError("libvirt asked")

    monkeypatch.setattr(state, "listing", asked)
    for fmt in ("{{.Bogus}}", "{.Name}", "yaml"):
        assert run_cli(["ls", "--format", fmt]) == base.EXIT_USAGE
        assert ".Name" in capsys.readouterr().err
    assert run_cli(["ls", "--filter", "state=bogus"]) == base.EXIT_USAGE
    assert "state is one of booting, running" in capsys.readouterr().err


def test_logs_tail_and_since(tmp_path: Path) -> None:
    from vmsandbox.core import listing

    log = tmp_path / "proxy.log"
    older = tmp_path / "proxy.log.1"
    older.write_text("o1\no2\n")
    log.write_text("l1\nl2\nl3\npartial")
    got = list(listing.lines(log, older, follow=False, stopped=lambda: True, tail=2))
    assert got == ["l2", "l3"]
    assert list(listing.lines(log, older, follow=False, stopped=lambda: True, tail=4)) == ["o2", "l1", "l2", "l3"]
    assert logs.parse_age("10m") == 600 and logs.parse_age("2h") == 7200 and logs.parse_age("30") == 30
    with pytest.raises(UsageError):
        logs.parse_age("yesterday")


@pytest.mark.usefixtures("isolated_dirs")
def test_ssh_config_is_a_block_an_editor_uses_as_is(capsys: pytest.CaptureFixture[str]) -> None:
    saved_record("exp1", ssh_port=2201)
    assert run_cli(["inspect", "--format", "ssh-config", "exp1"]) == 0
    block = capsys.readouterr().out
    lines = block.splitlines()
    assert lines[0] == "Host vmsandbox-exp1"
    options = dict(line.split(" ", 1) for line in (x.strip() for x in lines[1:]))
    assert options["HostName"] == "127.0.0.1" and options["Port"] == "2201" and options["User"] == "u"
    assert options["StrictHostKeyChecking"] == "yes"
    assert options["UserKnownHostsFile"] == str(paths.session_paths("exp1").known_hosts)
    assert "ControlPath" not in options and "ControlMaster" not in options  # our socket stays ours
    assert run_cli(["inspect", "--format", "ssh-config"]) == base.EXIT_USAGE


@pytest.mark.usefixtures("isolated_dirs")
def test_ssh_config_all_prints_every_block_it_can_and_names_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    saved_record("exp1", ssh_port=2201)
    saved_record("exp2", ssh_port=2202)
    broken = paths.session_paths("broken")
    broken.root.mkdir(parents=True)
    broken.record.write_text(json.dumps(["not", "a", "record"]))
    assert run_cli(["inspect", "--format", "ssh-config", "--all"]) == base.EXIT_FAILED
    captured = capsys.readouterr()
    hosts = [line for line in captured.out.splitlines() if line.startswith("Host ")]
    assert hosts == ["Host vmsandbox-exp1", "Host vmsandbox-exp2"]
    assert "\n\nHost vmsandbox-exp2" in captured.out  # blocks apart, as ~/.ssh/config reads them
    assert "could not inspect 1 of 3 sessions: broken" in captured.err


# Completion, through bash's protocol: bash splits the line into COMP_WORDS (at spaces, and at `=` and `:`, which
# are in COMP_WORDBREAKS), and replaces its current word with each answer.
BREAKS = re.compile(r"([=:]+)")


def bash_words(line: str) -> list[str]:
    words: list[str] = []
    for token in line.split(" "):
        words += [w for w in BREAKS.split(token) if w] or [""]
    return words


def complete(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], line: str) -> list[str]:
    """What the word being completed (the last of `line`) becomes for each answer bash gets."""
    words = bash_words(line)
    monkeypatch.setenv("_VMSANDBOX_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "\n".join(words))  # as the script joins them (IFS=$'\n')
    monkeypatch.setenv("COMP_CWORD", str(len(words) - 1))
    capsys.readouterr()
    run_cli([])
    monkeypatch.delenv("_VMSANDBOX_COMPLETE")
    current = line.rsplit(" ", maxsplit=1)[-1]
    kept = current[: len(current) - len(words[-1])]  # what bash does not replace
    return sorted(kept + answer for answer in capsys.readouterr().out.splitlines() if answer)


@pytest.mark.usefixtures("isolated_dirs")
def test_completion_offers_every_finite_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], isolated_dirs: Path, tmp_path: Path
) -> None:
    from vmsandbox import trust
    from vmsandbox.core import listing
    from vmsandbox.egress import secrets
    from vmsandbox.egress.ports import Publish

    saved_record("exp1", publish=(Publish(3000, 40000), Publish(8080, 40001)))
    saved_record("exp2", group="fan")
    saved_record("other")
    cps = paths.session_paths("exp1").checkpoints
    for label in ("before", "after"):
        (cps / label).mkdir(parents=True)
        (cps / label / "checkpoint.json").write_text(json.dumps({"label": label, "created": time.time(), "chain": []}))
    secrets.put("my-key", "v")
    (isolated_dirs / "config" / "config.yaml").write_text("hosts:\n  - {name: big, uri: 'qemu+ssh://me@big/system'}\n")
    (tmp_path / ".vmsandbox.yaml").write_text("network: open\n")
    assert run_cli(["config", "trust", "add", "--yes", str(tmp_path)]) == 0
    offered = {
        "vmsandbox rm e": ["exp1", "exp2"],
        "vmsandbox shell ": ["exp1", "exp2", "other"],
        "vmsandbox stop exp1 ": ["exp2", "other"],  # not exp1 again
        "vmsandbox rm --group ": ["fan"],  # fan-outs, not sessions
        "vmsandbox diff exp1 --against ": ["exp2", "other"],
        "vmsandbox cp ./f ex": ["exp1:", "exp2:"],
        "vmsandbox cp ex": [],  # a host path first: the shell's files
        "vmsandbox port rm exp1 ": ["3000", "8080"],
        "vmsandbox checkpoint restore exp1 ": ["after", "before"],
        "vmsandbox run --accel ": ["auto", "kvm", "tcg"],
        "vmsandbox run --network o": ["open"],
        "vmsandbox run --review ": ["terminal", "web"],
        "vmsandbox run --blueprint cl": ["claude"],
        "vmsandbox image build --blueprint co": ["codex"],
        "vmsandbox image show cl": ["claude"],
        "vmsandbox run --host ": ["big", "local"],
        "vmsandbox host rm ": ["big"],
        "vmsandbox login add ": ["claude", "codex", "gemini", "opencode"],  # only agents with a login
        "vmsandbox secret rm ": ["my-key"],
        "vmsandbox ls --format ": ["json", "table"],
        "vmsandbox inspect --format s": ["ssh-config"],
        "vmsandbox ls --filter st": ["state="],
        "vmsandbox ls --filter state=": [f"state={s}" for s in listing.STATES],
        "vmsandbox ls --filter state=ru": ["state=running"],
        "vmsandbox ls --filter host=b": ["host=big"],
        "vmsandbox ls --filter=network=n": ["--filter=network=none"],
        "vmsandbox help check": ["checkpoint"],
        "vmsandbox help checkpoint r": ["restore", "rm"],
        "vmsandbox help config t": ["trust"],
        "vmsandbox config trust ": ["add", "ls", "rm"],
        "vmsandbox config trust rm ": [trust.key(tmp_path / ".vmsandbox.yaml")],
        "vmsandbox im": ["image"],  # not `blueprint`, an old name
        "vmsandbox tru": [],
        "vmsandbox completion ": ["bash", "fish", "zsh"],
    }
    for line, expected in offered.items():
        assert complete(monkeypatch, capsys, line) == sorted(expected), line


def test_completion_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in ("bash", "zsh", "fish"):
        assert run_cli(["completion", shell]) == 0
        assert "_VMSANDBOX_COMPLETE=complete_" + shell in capsys.readouterr().out
    assert run_cli(["completion", "bash"]) == 0
    assert "compopt -o nospace" in capsys.readouterr().out  # `state=`, `exp1:`: the word goes on
    assert run_cli(["completion", "tcsh"]) == base.EXIT_USAGE


@pytest.mark.usefixtures("isolated_dirs")
def test_host_ls_counts_the_sessions_ls_shows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """libvirt's count of vmsandbox domains there (another account's, reader VMs) is not what `ls` lists."""
    from tests.unit.test_sshcheck import NODE
    from vmsandbox.session.host import hosts
    from vmsandbox.session.place.hostspec import HostSpec

    saved_record("a")
    saved_record("b")
    saved_record("c", host="far")
    local = HostSpec("local", "qemu:///system")
    monkeypatch.setattr(hosts, "probe_all", lambda specs, timeout: [hosts.Status(local, NODE, None, sessions=7)])
    monkeypatch.setattr(hosts.Status, "accel", property(lambda self: "kvm"))
    monkeypatch.setattr(hosts.Status, "as_dict", lambda self, memory_mib: {"name": "local", "uri": local.uri,
                        "reachable": True, "accel": "kvm", "available_mib": 1024, "memory_mib": 2048,
                        "max_sessions": None, "images": [], "room": 0})  # fmt: skip
    assert run_cli(["host", "ls", "--format", "{{.Name}} {{.Sessions}}"]) == 0
    assert capsys.readouterr().out == "local 2\n"
    assert run_cli(["host", "ls"]) == 0
    (_head, row) = capsys.readouterr().out.splitlines()
    assert row.split()[:5] == ["local", "ok", "kvm", "1.0G/2.0G", "2"]


@pytest.mark.usefixtures("isolated_dirs")
def test_host_add_and_rm_edit_your_config_where_hosts_are(
    capsys: pytest.CaptureFixture[str], isolated_dirs: Path
) -> None:
    from vmsandbox.session import settings

    mine = isolated_dirs / "config" / "config.yaml"
    mine.write_text("cpus: 2  # two, mine\nhosts:\n  - name: a\n    uri: qemu+ssh://me@a/system\n# kept\nmemory: 3G\n")
    assert run_cli(["host", "add", "big", "qemu+ssh://me@big/system", "--max-sessions", "4"]) == 0
    text = mine.read_text()
    assert text.startswith("cpus: 2  # two, mine\nhosts:\n") and "# kept\nmemory: 3G\n" in text  # as it was
    assert [(h.name, h.max_sessions) for h in settings.load().hosts] == [("a", None), ("big", 4)]
    for refused in (["host", "add", "big", "qemu+ssh://me@b/system"], ["host", "add", "x", "qemu+tcp://b/system"],
                    ["host", "add", "local", "qemu+ssh://me@b/system"], ["host", "rm", "nosuch"]):  # fmt: skip
        assert run_cli(refused) == base.EXIT_USAGE, refused
    assert mine.read_text() == text  # nothing written by a refusal
    assert run_cli(["host", "rm", "a"]) == 0
    assert [h.name for h in settings.load().hosts] == ["big"] and "# two, mine" in mine.read_text()
    assert run_cli(["host", "rm", "big"]) == 0
    assert settings.load().hosts == () and "hosts" not in mine.read_text()
    mine.write_text("cpus: many\n")
    assert run_cli(["host", "add", "big", "qemu+ssh://me@big/system"]) == base.EXIT_FAILED  # a broken file: as is
    assert mine.read_text() == "cpus: many\n"


@pytest.mark.usefixtures("isolated_dirs")
def test_policy_ls_lists_what_the_proxy_reads(capsys: pytest.CaptureFixture[str]) -> None:
    from vmsandbox.egress import policy

    record = saved_record("exp1")
    policy.write_config(record.files, {"mode": "allowlist", "allow": ["pypi.org", "*.npmjs.org:443"], "secrets": [],
                                       "allow_networks": ["203.0.113.0/24"]})  # fmt: skip
    assert run_cli(["policy", "ls", "exp1", "-q"]) == 0
    assert capsys.readouterr().out.split() == ["pypi.org", "*.npmjs.org:443", "203.0.113.0/24"]
    assert run_cli(["policy", "ls", "exp1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == {"entry": "pypi.org", "kind": "host"}
    saved_record("none")
    assert run_cli(["policy", "ls", "none"]) == 0
    assert "policy allow none HOST" in capsys.readouterr().err


@pytest.mark.usefixtures("isolated_dirs")
def test_a_fanout_is_refused_before_any_image_is_looked_up(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vmsandbox.image import store

    def looked_up() -> Any:
        raise AssertionError("an image was looked up")

    monkeypatch.setattr(store, "current_image", looked_up)
    refused = (
        (["run", "--fanout", "0", str(tmp_path)], "1 to 64"),
        (["run", "--fanout", "2", "--yes", str(tmp_path)], "--yes does not go with --fanout"),
        (["claude", "--fanout", "2", "--keep", str(tmp_path)], "--keep does not go with --fanout"),
    )
    for argv, said in refused:
        assert run_cli([*argv, "--", "true"]) == base.EXIT_USAGE, argv
        assert said in capsys.readouterr().err


@pytest.mark.usefixtures("isolated_dirs")
def test_create_makes_a_session_and_runs_nothing_or_copies_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from vmsandbox.core import sessions
    from vmsandbox.guest import commands

    made: list[Any] = []

    def create(path: Path, bp: str, flags: Any, person: Any) -> Any:
        made.append((path, bp, flags))
        return saved_record(flags.name)

    def copy_of(name: str, new: str, label: str | None) -> Any:
        made.append((name, new, label))
        return saved_record(new, forked_from=name)

    monkeypatch.setattr(sessions, "create", create)
    monkeypatch.setattr(sessions, "copy_of", copy_of)
    monkeypatch.setattr(commands, "attach", lambda *a, **k: pytest.fail("a command was run"))
    assert run_cli(["create", "--name", "exp", "-b", "claude", "--cpus", "1", str(tmp_path)]) == 0
    (path, bp, flags) = made.pop()
    assert (path, bp, flags.name, flags.cpus, flags.review, flags.fanout) == (
        tmp_path,
        "claude",
        "exp",
        1,
        "terminal",
        None,
    )
    assert "vmsandbox shell exp" in capsys.readouterr().err
    assert run_cli(["create", "--from", "exp:before", "--name", "exp-b"]) == 0
    assert made.pop() == ("exp", "exp-b", "before")
    assert run_cli(["fork", "exp", "exp-c"]) == base.EXIT_USAGE  # an old name: no command, said how it is done
    assert "`vmsandbox create --from NAME[:LABEL] --name NEW`" in capsys.readouterr().err and made == []


def test_a_global_flag_is_taken_anywhere_but_in_the_guest_s_command() -> None:
    from vmsandbox.cli.main import global_flags

    assert global_flags(["ls", "-v"]) == ["-v", "ls"]
    assert global_flags(["rm", "exp", "--verbose", "-f"]) == ["--verbose", "rm", "exp", "-f"]
    assert global_flags(["exec", "exp", "--", "ls", "-v"]) == ["exec", "exp", "--", "ls", "-v"]
    assert global_flags(["shell", "-v", "exp", "ls", "-v"]) == ["-v", "shell", "exp", "ls", "-v"]


# Issue 56: one grammar without traps. A word a person mistypes or guesses is an error, never a different verb.

TRAPS = [
    ["checkpoint", "exp1"],  # a guess at "exp1's checkpoints": it took one
    ["checkpoint", "exp1", "before"],
    ["checkpoint", "lst"],
    ["checkpoint", "lst", "exp1"],
    ["login", "claude"],
    ["login", "codex", "--from", "exp1"],
    ["login", "gemini", "--forget"],
    ["port", "exp1"],
    ["port", "exp1", "publish", "8080:3000"],
    ["logs", "exp1", "proxy"],
    ["destroy", "exp1"],
    ["fork", "exp1", "exp2"],
    ["fanout", "3", "."],
    ["compare", "exp1", "exp2"],
    ["rollback", "exp1", "before"],
    ["recover", "exp1"],
    ["gc"],
    ["clean", "exp1"],
    ["allow", "exp1", "example.com"],
    ["trust", "."],
    ["blueprint", "ls"],
    ["ssh", "exp1"],
    ["stpo", "exp1"],
    ["rn", "exp1"],
    ["image", "lst"],
    ["secret", "rmm", "exp1"],
]


@pytest.fixture
def nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Session exp1, and every verb of the core that changes a session or this machine failing the test if
    called."""
    from vmsandbox.core import moments, secrets, sessions, settings, watch

    saved_record("exp1")
    for module, names in ((moments, ("take", "restore", "remove")), (sessions, ("destroy", "create", "copy_of",
                          "stop", "start", "attach")), (secrets, ("sign_in", "keep_from", "forget")),
                          (watch, ("publish", "unpublish", "wipe")), (settings, ("trust_file", "revoke"))):  # fmt: skip
        for name in names:
            monkeypatch.setattr(module, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} was called"))


@pytest.mark.usefixtures("nothing_changes")
@pytest.mark.parametrize("argv", TRAPS, ids=" ".join)
def test_a_trap_shape_is_a_usage_error_that_names_the_command_and_does_nothing(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(argv) == base.EXIT_USAGE
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), err
    assert "is now" not in err and ("`vmsandbox " in lines[1] or "usage: vmsandbox" in lines[1]), err
    assert paths.session_paths("exp1").record.exists()


@pytest.mark.usefixtures("nothing_changes")
@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["lss"], "did you mean `vmsandbox ls`?"),
        (["sl"], "did you mean `vmsandbox ls`?"),
        (["stpo", "exp1"], "did you mean `vmsandbox stop exp1`?"),
        (["rn", "exp1"], "did you mean `vmsandbox rm exp1`?"),
        (["pul", "exp1"], "did you mean `vmsandbox pull exp1`?"),
        (["strat", "exp1"], "did you mean `vmsandbox start exp1`?"),
        (["image", "lst"], "did you mean `vmsandbox image ls`?"),
        (["checkpoint", "lst", "exp1"], "did you mean `vmsandbox checkpoint ls exp1`?"),
        (["config", "trust", "ad", "."], "did you mean `vmsandbox config trust add .`?"),
        (["destory", "exp1"], "`vmsandbox rm NAME` removes a session"),  # a typo of an old name: what does it now
        (
            ["checkpoint", "exp1"],
            "the verb comes first: `vmsandbox checkpoint ls exp1` or `vmsandbox checkpoint create",
        ),
        (["port", "exp1"], "`vmsandbox port ls exp1` or `vmsandbox port publish exp1 PORT`"),
        (["login", "claude"], "`vmsandbox login add claude`"),
        (["exp1"], "`vmsandbox shell exp1` opens a shell in it"),
        (["frobnicate"], "`vmsandbox -h` lists the commands"),
        (["image", "frobnicate"], "`vmsandbox image -h` lists the verbs"),
    ],
)
def test_did_you_mean_from_two_letters_up_and_the_verb_first(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(argv) == base.EXIT_USAGE
    assert hint in capsys.readouterr().err.splitlines()[-1]


def test_edit_distance_counts_a_swap_as_one_edit() -> None:
    from vmsandbox.cli import aliases

    assert [aliases.distance(a, b) for a, b in (("stpo", "stop"), ("lss", "ls"), ("ls", "ls"), ("rm", "cp"))] == [
        1, 1, 0, 2,
    ]  # fmt: skip
    assert aliases.nearest("x", ["ls"]) is None  # one letter: nothing near
    assert aliases.nearest("xyzzy", ["ls", "rm"]) is None


def test_list_and_remove_are_ls_and_rm_wherever_those_are(capsys: pytest.CaptureFixture[str]) -> None:
    """Every group with `ls` takes `list` (and `rm`, `remove`): the same command, its help the same, hidden from
    help and completion; docker's `ps` is `ls` at the top only."""
    groups = [("", typer.main.get_command(base.app))] + [(n, c) for n, c in all_commands() if hasattr(c, "commands")]
    checked = 0
    for name, group in groups:
        path = name.split(" ") if name else []
        for same, verb in (("list", "ls"), ("remove", "rm"), *((("ps", "ls"),) if not path else ())):
            if verb not in group.commands:
                assert run_cli([*path, same, "-h"]) == base.EXIT_USAGE, (name, same)
                capsys.readouterr()
                continue
            assert run_cli([*path, same, "-h"]) == 0, (name, same)
            taken = capsys.readouterr()
            assert run_cli([*path, verb, "-h"]) == 0
            assert taken.out == capsys.readouterr().out and taken.err == "", (name, same)
            checked += 1
        assert not {"list", "remove", "ps"} & set(group.commands), name
    assert checked >= 10
    assert run_cli(["-h"]) == 0
    assert not re.search(r"^  (list|remove|ps)\b", capsys.readouterr().out, re.MULTILINE)


@pytest.mark.usefixtures("isolated_dirs")
def test_ls_and_ps_take_docker_s_all(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from vmsandbox.core import listing

    monkeypatch.setattr(listing, "rows", lambda broken=None: [{"name": "exp1", "state": "running"},
                                                              {"name": "exp2", "state": "stopped"}])  # fmt: skip
    assert run_cli(["ls", "-q"]) == 0
    listed = capsys.readouterr().out
    assert listed == "exp1\nexp2\n"
    for argv in (["ls", "-a"], ["ps", "-a"], ["ps", "--all"], ["list", "-a"]):
        assert run_cli([*argv, "-q"]) == 0, argv
        assert capsys.readouterr().out == listed, argv  # every session, as `ls` lists them anyway
    assert run_cli(["ls", "-h"]) == 0
    assert "docker's ps -a" in capsys.readouterr().out


@pytest.mark.usefixtures("isolated_dirs")
def test_inspect_takes_docker_s_f_for_format(capsys: pytest.CaptureFixture[str]) -> None:
    saved_record("exp1")
    assert run_cli(["inspect", "--format", "{{.Name}} {{.User}}", "exp1"]) == 0
    long = capsys.readouterr().out
    assert long == "exp1 u\n"
    assert run_cli(["inspect", "-f", "{{.Name}} {{.User}}", "exp1"]) == 0
    assert capsys.readouterr().out == long
    assert run_cli(["inspect", "-f", "json", "exp1"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "exp1"  # an array, as docker inspect


@pytest.mark.parametrize(
    "argv",
    [
        ["nosuch"],
        ["ls", "--bogus"],
        ["ls", "-a", "extra"],
        ["checkpoint", "rm", "exp1"],
        ["run", "--cpus", "many"],
        ["ui", "--port", "99999"],
        ["serve", "--port", "-1"],
        ["host", "ls", "--timeout", "inf"],
        ["host", "ls", "--timeout", "nan"],
        ["logs", "exp1", "--tail", str(10**30)],
        ["policy", "log", "exp1", "-n", "-5"],
        ["host", "add", "big", "qemu+ssh://me@big/system", "--max-sessions", "0"],
        ["shell", "--bogus", "exp1"],
        ["exec", "--bogus", "exp1", "true"],
        ["inspect", "-f"],
    ],
    ids=" ".join,
)
def test_a_parser_error_is_said_as_ours_one_error_line_and_a_hint(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(argv) == base.EXIT_USAGE
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 2, captured.err
    assert re.match(r"error: [a-z`-]", lines[0]) and lines[1].startswith("hint: "), captured.err
    for other in ("Usage:", "Try ", "Error:", "Traceback"):
        assert other not in captured.err


def test_a_parser_error_hint_is_the_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["checkpoint", "rm", "exp1"]) == base.EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [
        "error: missing argument 'LABEL'",
        "hint: usage: vmsandbox checkpoint rm [OPTIONS] NAME LABEL (`vmsandbox checkpoint rm -h` says more)",
    ]
    assert run_cli(["ui", "--port", "99999"]) == base.EXIT_USAGE
    assert "error: invalid value for '--port': at most 65535" in capsys.readouterr().err


def _takes_a_session(command: Any) -> bool:
    from vmsandbox.cli import complete

    first = next((p for p in command.params if p.param_type_name == "argument"), None)
    return first is not None and _completion_of(first) is complete.sessions


@pytest.mark.usefixtures("nothing_changes")
def test_an_invalid_session_name_is_a_usage_error_in_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 wherever a session is named (never 1 in one command, 125 in another), before anything is done."""
    checked = []
    for name, command in all_commands():
        if not _takes_a_session(command):
            continue
        others = [p for p in command.params if p.param_type_name == "argument"][1:]
        argv = [*name.split(" "), "Bad_Name", *("x" for p in others if p.required)]
        if name == "exec":
            argv.append("true")
        assert run_cli(argv) == base.EXIT_USAGE, argv
        assert "error: invalid session name 'Bad_Name'" in capsys.readouterr().err, argv
        checked.append(name)
    assert {"inspect", "rm", "shell", "exec", "stop", "logs", "pull", "checkpoint create", "port ls"} <= set(checked)
    assert run_cli(["rm", "exp1", "-it"]) == base.EXIT_USAGE  # the parser's: no such option
    assert paths.session_paths("exp1").record.exists()


def _numbers() -> list[tuple[str, Any]]:
    return [
        (f"{name} {max(p.opts, key=len)}", p)
        for name, command in all_commands()
        for p in command.params
        if p.type_descriptor.annotation in (int, float)
    ]


CHECKED_BY_THE_COMMAND = {"--cpus", "--fanout", "serve --port"}  # the command says its bounds (tested below)


def test_every_number_option_has_bounds_the_parser_keeps(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A number given on the line out of range is a usage error, never a traceback (`ui --port 99999` was 35
    lines of one): the parser keeps its bounds, or the command says them (run's --cpus and --fanout)."""
    unbounded = []
    for name, param in _numbers():
        info = param.type_descriptor.parameter_info
        if (info.min is None or info.max is None) and not any(c in name for c in CHECKED_BY_THE_COMMAND):
            unbounded.append(name)
    assert unbounded == []
    for argv in (["config", "show", "a" * 5000], ["run", "b" * 5000, "--", "true"], ["create", "c" * 5000]):
        assert run_cli(argv) == base.EXIT_USAGE, argv[:2]  # a path too long for any file system: said, exit 2
        err = capsys.readouterr().err
        assert "error: file name too long: " in err and " characters)\nhint: " in err and "Traceback" not in err
    huge = str(10**30)
    for argv in (["run", str(tmp_path), "--cpus", huge, "--", "true"],
                 ["run", str(tmp_path), "--fanout", huge, "--", "true"], ["serve", "--port", "65536"]):  # fmt: skip
        assert run_cli(argv) == base.EXIT_USAGE, argv
        assert "Traceback" not in capsys.readouterr().err


def test_run_takes_docker_s_rm_with_a_note_that_removal_is_the_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vmsandbox.cli.sessions import run

    ran: list[Any] = []
    monkeypatch.setattr(run, "run_session", lambda path, bp, cmd, flags, **k: ran.append((cmd, flags)))
    for argv in (["run", "--rm", str(tmp_path), "--", "true"], ["claude", "--rm", str(tmp_path)]):
        assert run_cli(argv) == 0, argv
        (_cmd, flags) = ran.pop()
        assert not flags.keep and flags.fanout is None
        assert capsys.readouterr().err == "note: --rm is the default here: the VM goes at the end unless --keep\n"
    assert run_cli(["run", str(tmp_path), "--", "true"]) == 0
    assert capsys.readouterr().err == "" and ran.pop()[1].keep is False  # said only when given
    for both in (["--rm", "--keep"], ["--rm", "--fanout", "2"]):
        assert run_cli(["run", *both, str(tmp_path), "--", "true"]) == base.EXIT_USAGE
        assert "--rm does not go with" in capsys.readouterr().err and ran == []
