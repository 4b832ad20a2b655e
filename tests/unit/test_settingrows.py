"""Each key of a config file is one row (session/settingrows.py): the settings a session gets, a project's file, the
way sources meet and the table in docs/configuration.md all follow the rows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from vmsandbox import trust
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import settingrows, settings
from vmsandbox.session.settingrows import SETTINGS, Merge, Project, Setting

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HEAD = "| key | default | what it is | a later source | a project's file |"


def _default(row: Setting) -> str:
    return row.default if isinstance(row.default, str) else json.dumps(row.default)


def table() -> str:
    """The keys' table, as docs/configuration.md shows it, made from the rows."""
    lines = [HEAD, "| --- | --- | --- | --- | --- |"]
    for row in SETTINGS:
        said = row.help.replace("|", "\\|")
        lines.append(f"| `{row.key}` | `{_default(row)}` | {said} | {row.merge.value} | {row.project.value} |")
    return "\n".join(lines)


def documented(text: str) -> str:
    """The table of a page: from its head to the first line that is not a table's."""
    lines = text.splitlines()
    start = lines.index(HEAD)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_the_docs_table_is_the_rows() -> None:
    assert documented(DOCS.read_text()) == table(), f"docs/configuration.md's table should read:\n{table()}"


def test_the_docs_check_finds_a_row_out_of_date() -> None:
    stale = DOCS.read_text().replace("| `cpus` | `2` |", "| `cpus` | `4` |")
    assert stale != DOCS.read_text() and documented(stale) != table()


def test_the_settings_hold_every_row_once_with_its_default() -> None:
    """A field of settings.Settings for each row (a size as `KEY_mib`), and its default is the row's, read."""
    fields = {f.name: f.default for f in dataclasses.fields(settings.Settings)}
    assert sorted(fields) == sorted(row.field_name for row in SETTINGS)
    for row in SETTINGS:
        where = f"the default of `{row.key}`"
        if row.listed:
            read, _ = row.entries(row.default, "default", lambda key: f"`{key}`", set())
        else:
            read = row.reads(row.default, where)
        assert read == fields[row.field_name], row.key


def test_a_field_without_a_row_is_no_key() -> None:
    assert settingrows.key_of("memory_mib") == "memory" and settingrows.key_of("cpus") == "cpus"
    assert settingrows.key_of("no_such_mib") not in settingrows.FIELDS


# A value of each key a project's file may write (past the defaults, for those that only size the VM).
WRITTEN: dict[str, Any] = {
    "cpus": 4,
    "memory": "4G",
    "disk": "30G",
    "accel": "tcg",
    "libvirt_uri": "qemu:///session",
    "boot_timeout": 60,
    "trust_host_ca": False,
    "network": "open",
    "allow": ["b.example"],
    "allow_networks": ["198.51.100.0/24"],
    "secrets": [{"secret": "k", "host": "api.example.com", "header": "Authorization"}],
    "sync_limit": "1G",
    "mass_change_files": 10,
    "mass_change_size": "10M",
    "hosts": [{"name": "big", "uri": "qemu+ssh://me@big/system"}],
}


def test_every_row_has_a_value_here() -> None:
    assert set(WRITTEN) == set(settingrows.FIELDS)  # a new key needs one


@pytest.mark.parametrize("row", SETTINGS, ids=lambda row: row.key)
def test_a_project_sets_a_key_as_its_row_says(tmp_path: Path, row: Setting) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / ".vmsandbox.yaml").write_text(json.dumps({row.key: WRITTEN[row.key]}))
    if row.project is Project.NEVER:
        with pytest.raises(VmsandboxError, match=f"`{row.key}` is never taken from a project file"):
            settings.load(project)
        return
    if row.project is not Project.SIZES:
        with pytest.raises(trust.UntrustedError, match=f"`{row.key}`"):
            settings.load(project)
        trust.trust(project / ".vmsandbox.yaml", (project / ".vmsandbox.yaml").read_bytes())
    held = getattr(settings.load(project), row.field_name)
    assert held != getattr(settings.Settings(), row.field_name)


@pytest.mark.parametrize("row", [r for r in SETTINGS if r.project is not Project.NEVER], ids=lambda row: row.key)
def test_a_later_source_meets_an_earlier_one_as_the_row_says(row: Setting) -> None:
    first = settings.Settings().merged({row.key: WRITTEN[row.key]}, "your file")
    before = getattr(first, row.field_name)

    def later(again: Any) -> Any:
        return getattr(first.merged({row.key: again}, "the project's file"), row.field_name)

    if row.merge is Merge.REPLACES:
        assert later(row.default) == getattr(settings.Settings(), row.field_name) != before
    elif row.merge is Merge.ADDS:
        again = {"allow": "c.example", "allow_networks": "203.0.113.0/24"}[row.key]
        assert later([again]) == (*before, again) and later(WRITTEN[row.key]) == before  # each entry once
    else:  # per host: another host's is added, the same host's replaces
        (mapping,) = WRITTEN[row.key]
        elsewhere = later([{**mapping, "host": "other.example.com", "secret": "j"}])
        assert [(m.host, m.secret) for m in elsewhere] == [("api.example.com", "k"), ("other.example.com", "j")]
        assert [(m.host, m.secret) for m in later([{**mapping, "secret": "j"}])] == [("api.example.com", "j")]
