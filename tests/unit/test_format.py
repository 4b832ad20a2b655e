"""How listings come out (issue 56): `--format` as the subset of Go's text/template docker users write (every
construct, syntax errors at their column, what lies outside the subset named), headers that are field names, one
JSON form, `-q` alone, and tables that keep every value whole, leaving out columns instead."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import typer.main

from tests.unit.test_cli import run_cli
from vmsandbox.cli import base, output
from vmsandbox.cli.nouns import checkpoint, config, host, image, login, policy, port, secret, trust
from vmsandbox.cli.sessions import listing
from vmsandbox.cli.template import checked
from vmsandbox.cli.template.functions import printf
from vmsandbox.errors import UsageError

ROW: dict[str, Any] = {
    "name": "exp-1", "state": "running", "ports": {"ssh": 2222, "http": 80}, "files": ["a", "b"], "keep": False,
    "cpus": 2, "group": None, "available_mib": 1024, "note": "", "created": 1796518680.5,
}  # fmt: skip
FIELDS = tuple(ROW)


def render(text: str, row: dict[str, Any] = ROW) -> str:
    return checked.check(text, FIELDS).render(row)


def refusal(text: str, fields: tuple[str, ...] = FIELDS) -> UsageError:
    with pytest.raises(UsageError) as refused:
        checked.check(text, fields).render(ROW)
    return refused.value


# The subset, construct by construct
@pytest.mark.parametrize(
    ("template", "printed"),
    [
        ("{{.Name}} {{ .State }}", "exp-1 running"),
        ("{{.Ports.ssh}} {{.ports.SSH}} {{.available_mib}} {{.AVAILABLEMIB}}", "2222 2222 1024 1024"),  # any case
        ("{{.Group}} {{.Ports.nope}}", "- -"),  # None (and a key a map has not): the tables' dash
        ("{{.Keep}} {{.Cpus}} {{.Created}} {{.Files}} {{.Ports}}", "false 2 1796518680.5 [a b] map[http:80 ssh:2222]"),
        (
            "{{json .Ports}} {{json .Files}} {{json .Group}} {{json .Name}}",
            '{"ssh":2222,"http":80} ["a","b"] null "exp-1"',
        ),
        ("{{range .Files}}<{{.}}>{{end}}", "<a><b>"),
        ("{{range .Ports}}{{.}};{{end}}", "80;2222;"),  # a map's values, by its keys' order
        ("{{range .Group}}x{{else}}none{{end}} {{range .Files}}{{else}}none{{end}}", "none "),
        ("{{if .Keep}}k{{else if .Cpus}}c{{else}}n{{end}}", "c"),
        (
            "{{if .Note}}x{{else}}empty{{end}} {{if .Group}}x{{else}}nil{{end}} {{if .Files}}list{{end}}",
            "empty nil list",
        ),
        ('{{.Name | upper}} {{upper .State}} {{lower "ABC"}} {{.Name | upper | lower}}', "EXP-1 RUNNING abc exp-1"),
        ('{{join .Files ","}} {{.Files | join "+"}}', "a,b a+b"),
        ('{{printf "%-8s|%4d|%q|%v" .Name .Cpus .State .Keep}}', 'exp-1   |   2|"running"|false'),
        ("{{.Name -}}  \\t  {{- .State}} {{- /* a comment */ -}} !", "exp-1running!"),
        ("a\\tb\\nc", "a\tb\nc"),  # docker's \t and \n between actions
        ('{{len .Files}} {{index .Ports "ssh"}} {{index .Files 1}} {{(.Name)}}', "2 2222 b exp-1"),
        ('{{if eq .State "stopped" "running"}}up{{end}} {{if ne .Cpus 2}}x{{else}}two{{end}}', "up two"),
        ("{{not .Keep}} {{and .Cpus .Name}} {{and .Note .Name}} {{or .Group .Name}}", "true exp-1  exp-1"),
        ('{{"a}}b"}} {{`raw\\t`}} {{"\\t"}}', "a}}b raw\\t \t"),
        ("{{.Name}}}", "exp-1}"),  # a stray brace is text, as Go has it
    ],
)
def test_the_subset_docker_users_write(template: str, printed: str) -> None:
    assert render(template) == printed


def test_if_takes_gos_truthiness() -> None:
    for value, truth in ((False, False), (0, False), (0.0, False), ("", False), ([], False), ({}, False),
                         (None, False), (True, True), (1, True), ("0", True), ("false", True), ([0], True),
                         ({"a": None}, True)):  # fmt: skip
        assert render("{{if .Note}}yes{{else}}no{{end}}", {**ROW, "note": value}) == ("yes" if truth else "no"), value


def test_printf_takes_gos_verbs_and_says_a_wrong_argument_as_go_does() -> None:
    assert printf("%5s|%-5s|%.2s|%05d|%+d|%x|%X|%08.3f|%t|%%", "ab", "ab", "abc", 42, 3, 255, "hi", 3.14159, True) == (
        "   ab|ab   |ab|00042|+3|ff|6869|0003.142|true|%"
    )
    assert printf("%d %s %q", "x", 5, None) == "%!d(string=x) %!s(int=5) %!q(<nil>)"
    assert printf("%s %s", "a") == "a %!s(MISSING)"
    assert printf("%s", "a", 2) == "a%!(EXTRA int=2)"
    assert printf("%v %v %v", [1, "a"], {"b": 1}, None) == "[1 a] map[b:1] -"


# Errors: where, and what
@pytest.mark.parametrize(
    ("template", "said", "column"),
    [
        ("{{.Name}", "unclosed action", 1),
        ("{{.Name}} {{", "unclosed action", 11),
        ("table {{.Name}}\\t{{.State", "unclosed action", 18),
        ("{{.Name .State}}", "only a function takes arguments", 9),
        ("{{.Name | .State}}", "only a function takes a piped value", 11),
        ("{{if .Keep}}x", "{{if}} has no {{end}}", 3),
        ("{{.Name}}{{end}}", "{{end}} with no {{if}} or {{range}}", 12),
        ("{{range .Files}}{{else}}{{else}}{{end}}", "a second {{else}}", 27),
        ('{{printf "%s .Name}}', "unterminated string", 10),
        ("{{frob .Name}}", "no function 'frob'", 3),
        ("{{upper}}", "upper takes 1 argument, given 0", 3),
        ('{{join .Files "," "-"}}', "join takes 2 arguments, given 3", 3),
        ("{{.Name}} {{.Bogus}}", "no field .Bogus", 13),
        ("{{}}", "a value is missing", 3),
        ("{{.Name)}}", "unexpected ')'", 8),
    ],
)
def test_a_syntax_error_says_where(template: str, said: str, column: int) -> None:
    refused = refusal(template)
    first, shown, caret = refused.message.split("\n")
    assert first.startswith("--format: ") and said in first and f"at column {column}" in first, first
    assert shown == "  " + template and caret == "  " + " " * (column - 1) + "^"


def test_a_long_template_is_shown_around_its_fault() -> None:
    text = "{{.Name}} " * 20 + "{{.Bogus}}" + " {{.Name}}" * 20
    first, shown, caret = refusal(text).message.split("\n")
    assert "at column 203" in first and len(shown) < 90
    assert shown[caret.index("^") :].startswith(".Bogus")


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ("{{with .Name}}x{{end}}", "{{with}}"),
        ('{{define "x"}}x{{end}}', "{{define}}"),
        ('{{template "x"}}', "{{template}}"),
        ('{{block "x" .}}x{{end}}', "{{block}}"),
        ("{{range .Files}}{{break}}{{end}}", "{{break}}"),
        ("{{$x := .Name}}", "a variable ($x)"),
        ("{{range $i, $e := .Files}}{{end}}", "a variable ($i)"),
        ("{{ print .Name }}", "{{print}}"),
        ("{{if lt .Cpus 4}}x{{end}}", "{{lt}}"),
        ("{{'x'}}", "a character constant ('x')"),
    ],
)
def test_go_syntax_outside_the_subset_is_named_as_such(template: str, named: str) -> None:
    refused = refusal(template)
    assert f"--format: {named} at column" in refused.message
    assert "is Go template syntax that vmsandbox's --format does not take" in refused.message
    assert refused.hint is not None and "it takes {{.Field}}" in refused.hint and "printf" in refused.hint


def test_docker_s_own_functions_are_named_and_a_field_that_is_none_lists_the_fields() -> None:
    assert "docker's template function" in refusal("{{title .Name}}").message
    refused = refusal("{{.Nope}}")
    assert refused.hint is not None and ".Name, .State, .Ports" in refused.hint and ".AvailableMib" in refused.hint


def test_a_value_a_template_cannot_use_is_said_at_its_place() -> None:
    refused = refusal("{{range .Files}}{{.Name}}{{end}}")
    assert "can't evaluate field Name in string 'a' at column 19" in refused.message
    assert "column" in refusal("{{range .Name}}x{{end}}").message  # a string is no list


# Headers: the fields' names
def test_a_tables_headers_are_the_fields_names() -> None:
    shaped = checked.check(
        'table {{.Name}}\\t{{.AvailableMib}}\\t{{.ports.ssh}}\\t{{.Name | upper}}\\t{{printf "%-8s" .State}}'
        '\\t{{if .Keep}}y{{end}}\\t{{range .Files}}{{.}}{{end}}\\t{{json .Ports}}\\t{{join .Files ","}}!',
        FIELDS,
    )
    assert shaped.table
    assert shaped.headers().split("\t") == [
        "NAME", "AVAILABLE MIB", "PORTS SSH", "NAME", "STATE   ", "KEEP", "FILES", "PORTS", "FILES!",
    ]  # fmt: skip


LISTINGS: dict[str, tuple[output.Listing, ...]] = {
    "ls": (listing.SESSIONS,),
    "host ls": (host.HOSTS,),
    "image ls": (image.IMAGES, image.BLUEPRINTS),
    "checkpoint ls": (checkpoint.CHECKPOINTS,),
    "port ls": (port.PORTS,),
    "policy ls": (policy.ALLOWED,),
    "secret ls": (secret.SECRETS,),
    "login ls": (login.LOGINS,),
    "config show": (config.SETTINGS,),
    "config trust ls": (trust.TRUSTED,),
}


def test_each_default_tables_headers_are_fields_a_person_can_name() -> None:
    for name, listings in LISTINGS.items():
        for shown in listings:
            fields = [c.field for c in shown.columns]
            assert len(set(fields)) == len(fields), name
            for column in shown.columns:
                camel = "".join(w.capitalize() for w in column.header.split())
                one = checked.check(f"table {{{{.{camel}}}}}", shown.names)
                assert one.headers() == column.header, (name, column.field)
            made = [c.field for c in shown.columns if c.made is not None]
            assert not set(made) & set(shown.fields), name  # a field made for the table shadows none of the row's
            assert set(shown.keep) <= set(fields), name


def _commands() -> dict[str, Any]:
    found: dict[str, Any] = {}

    def walk(command: Any, prefix: str) -> None:
        for word, sub in getattr(command, "commands", {}).items():
            found[prefix + word] = sub
            walk(sub, prefix + word + " ")

    walk(typer.main.get_command(base.app), "")
    return found


def test_every_listings_help_examples_name_its_fields_and_run() -> None:
    """The --format help and the docstring's examples of each listing: parsed against its fields, run on a row
    (every field None)."""
    commands = _commands()
    with_format = {n for n, c in commands.items() if any(p.name == "fmt" for p in c.params) and n != "inspect"}
    assert with_format == set(LISTINGS)  # a new listing comes here, with its examples
    for name, listings in LISTINGS.items():
        command = commands[name]
        helps = [command.help or "", *(p.help or "" for p in command.params if p.name == "fmt")]
        examples = [e for text in helps for e in re.findall(r"'([^']*\{\{[^']*)'", text)]
        assert len(examples) >= 2, name  # the option's and the docstring's
        for example in examples:
            fits = [s for s in listings if _runs(example, s)]
            assert fits, f"{name}: {example}"


def _runs(example: str, shown: output.Listing) -> bool:
    try:
        checked.check(example, shown.names).render(dict.fromkeys(shown.names))
    except UsageError:
        return False
    return True


# The listings, end to end
def session_row(name: str, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(listing.FIELDS)
    row.pop("problem")
    row.pop("hint")
    row.update(name=name, state="running", host="local", created=1796518680.0, age_seconds=300, project="/p",
               ports={"ssh": 12345}, network="allowlist", egress="up", unsynced=0, memory={"pss_mib": 180})  # fmt: skip
    row.update(values)
    return row


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from vmsandbox.core import listing

    rows = [
        session_row("exp-1", project="/home/someone/src/a-project-with-a-rather-long-name/and/deeper/still"),
        session_row("exp-2", state="stopped", ports={"ssh": None}, memory=None, unsynced=None),
    ]
    monkeypatch.setattr(listing, "rows", lambda broken=None: [dict(r) for r in rows])
    monkeypatch.setenv("COLUMNS", "80")
    return rows


def test_json_is_one_object_a_line_in_every_form(capsys: pytest.CaptureFixture[str], sessions: Any) -> None:
    printed = []
    for argv in (["ls", "--json"], ["ls", "--format", "json"], ["ls", "--format", "{{json .}}"]):
        assert run_cli(argv) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] == printed[2]
    rows = [json.loads(line) for line in printed[0].splitlines()]
    assert [r["name"] for r in rows] == ["exp-1", "exp-2"]
    assert rows[0]["ports"] == {"ssh": 12345} and rows[0]["ssh"] == "127.0.0.1:12345" and rows[0]["age"] == "5m"
    assert rows[1]["ssh"] is None  # the fields the table shows are fields, in JSON too


def test_q_with_another_way_is_a_usage_error_before_anything_is_listed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.core import hosts, listing

    def asked(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("listed")

    monkeypatch.setattr(listing, "rows", asked)
    monkeypatch.setattr(hosts, "names", asked)
    for argv in (["ls", "-q", "--json"], ["ls", "-q", "--format", "{{.Name}}"], ["ls", "--json", "--format", "json"],
                 ["ls", "-q", "-o", "wide"], ["host", "ls", "-q", "--json"], ["image", "ls", "--json", "-o", "wide"],
                 ["secret", "ls", "-q", "--format", "json"]):  # fmt: skip
        assert run_cli(argv) == base.EXIT_USAGE, argv
        captured = capsys.readouterr()
        assert captured.out == "" and "choose one" in captured.err, argv
        assert len([line for line in captured.err.splitlines() if line.strip()]) == 1, captured.err
    assert run_cli(["ls", "-o", "tall"]) == base.EXIT_USAGE
    assert "-o tall: no such output" in capsys.readouterr().err


def test_a_piped_table_keeps_every_value_whole_and_leaves_out_columns(
    capsys: pytest.CaptureFixture[str], sessions: Any
) -> None:
    assert run_cli(["ls"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in captured.out
    assert lines[0].split() == ["NAME", "STATE", "AGE", "SSH", "NETWORK", "UNSYNCED", "MEM", "HOST"]
    assert lines[1].split() == ["exp-1", "running", "5m", "127.0.0.1:12345", "allowlist", "0", "180M", "local"]
    assert lines[2].split() == ["exp-2", "stopped", "5m", "-", "allowlist", "?", "-", "local"]
    assert "PROJECT left out to fit 80 columns: `-o wide` shows every column" in captured.err
    assert run_cli(["ls", "-o", "wide"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split()[-1] == "PROJECT" and lines[1].endswith("/and/deeper/still") and captured.err == ""


def test_the_columns_left_out_follow_the_listings_order_and_the_name_stays(
    capsys: pytest.CaptureFixture[str], sessions: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    assert run_cli(["ls"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].split() == ["NAME", "STATE", "AGE", "SSH"]  # UNSYNCED would make 41
    assert "NETWORK, UNSYNCED, MEM, HOST, PROJECT left out to fit 40 columns" in captured.err
    monkeypatch.setenv("COLUMNS", "4")
    assert run_cli(["ls"]) == 0
    assert capsys.readouterr().out.splitlines() == ["NAME", "exp-1", "exp-2"]  # wider than 4: the name, whole
    fitting = listing.SESSIONS.fitting([5, 7, 3, 15, 9, 6, 4, 5, 60], 40)
    assert fitting == [0, 1, 3, 5]  # name, state, ssh; project does not fit, unsynced does; then nothing more


def test_a_template_table_aligns_whole_columns_and_values_are_escaped(
    capsys: pytest.CaptureFixture[str], sessions: Any
) -> None:
    sessions[0]["project"] = "/p\x1b]0;x\x07"
    assert run_cli(["ls", "--format", "table {{.Name}}\\t{{.Ssh}}\\t{{.Project}}"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "NAME   SSH              PROJECT",
        "exp-1  127.0.0.1:12345  /p\\x1b]0;x\\x07",
        "exp-2  -                /p",
    ]
    assert run_cli(["ls", "--format", "{{.Name}}:{{.Project}}"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "exp-1:/p\\x1b]0;x\\x07"
    assert run_cli(["ls", "-q"]) == 0
    assert capsys.readouterr().out == "exp-1\nexp-2\n"


def test_an_empty_listing_prints_nothing_on_stdout_in_every_form(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.core import listing

    monkeypatch.setattr(listing, "rows", lambda broken=None: [])
    for argv in (["ls", "--json"], ["ls", "--format", "{{.Name}}"], ["ls", "-q"], ["ls"]):
        assert run_cli(argv) == 0
        assert capsys.readouterr().out == "", argv
    assert run_cli(["ls", "--format", "table {{.Name}}\\t{{.State}}"]) == 0
    assert capsys.readouterr().out == "NAME  STATE\n"  # docker's: the headers


def test_inspect_json_is_an_array_as_docker_inspect(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.core import listing

    monkeypatch.setattr(listing, "inspect", session_row)
    assert run_cli(["inspect", "exp-1", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["exp-1"]
    assert run_cli(["inspect", "exp-1", "exp-2", "--format", "{{.Name}} {{.Ports.ssh}}"]) == 0
    assert capsys.readouterr().out == "exp-1 12345\nexp-2 12345\n"
    assert run_cli(["inspect", "exp-1", "--format", "{{.Name}"]) == base.EXIT_USAGE
    assert "unclosed action at column 1" in capsys.readouterr().err
