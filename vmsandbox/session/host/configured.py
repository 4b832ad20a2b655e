"""`hosts:` of the user's config written by a command (`vmsandbox host add`, `host rm`): the file edited where
the list is, as text, so that what the person wrote around it (comments, order, spacing) stays as it was. The
new text is checked as a config is read (every key, the URI's transport, names unique) before it replaces the
old in one rename; a file with problems is not edited."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from vmsandbox import filewrite, paths
from vmsandbox.errors import UsageError, VmsandboxError
from vmsandbox.session import settings
from vmsandbox.session.place.hostspec import LOCAL


def user_file() -> Path:
    return paths.config_dir() / settings.USER_FILE


def _hosts_node(text: str) -> tuple[yaml.MappingNode | None, yaml.Node | None]:
    """The file's top mapping and the value node of its `hosts` key (None where there is none)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader) if text.strip() else None
    if root is not None and not isinstance(root, yaml.MappingNode):
        raise VmsandboxError(f"{user_file()}: not a mapping of keys", hint="`vmsandbox config validate` says more")
    if root is None:
        return None, None
    value = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "hosts"), None)
    return root, value


def _entry_lines(entry: dict[str, Any], indent: int) -> str:
    pad = " " * indent
    first, *rest = [f"{k}: {json.dumps(v)}" for k, v in entry.items()]
    return "".join([f"{pad}- {first}\n", *(f"{pad}  {line}\n" for line in rest)])


def added(text: str, entry: dict[str, Any]) -> str:
    """`text` (a config file) with `entry` appended to its `hosts:` list (the list made if there is none)."""
    _, hosts = _hosts_node(text)
    if hosts is None or (isinstance(hosts, yaml.ScalarNode) and hosts.value in ("", "~", "null")):
        if hosts is not None:  # `hosts:` with nothing after it
            start = text.rfind("\n", 0, hosts.start_mark.index) + 1
            line_end = text.find("\n", hosts.end_mark.index)
            text = text[:start] + text[(line_end + 1 if line_end >= 0 else len(text)) :]
        text = text if not text or text.endswith("\n") else text + "\n"
        return text + "hosts:\n" + _entry_lines(entry, 2)
    if not isinstance(hosts, yaml.SequenceNode):
        raise VmsandboxError(f"{user_file()}: `hosts` is not a list", hint="`vmsandbox config validate` says more")
    if hosts.flow_style:  # hosts: [ … ]: the entry goes in as JSON, which is YAML
        close = text.rindex("]", hosts.start_mark.index, hosts.end_mark.index)
        sep = ", " if hosts.value else ""
        return text[:close] + sep + json.dumps(entry) + text[close:]
    indent = hosts.start_mark.column
    at = _line_after(text, _last_scalar(hosts).end_mark.index)
    prefix = text[:at] if text[:at].endswith("\n") else text[:at] + "\n"
    return prefix + _entry_lines(entry, indent) + text[at:]


def removed(text: str, name: str) -> str:
    """`text` without the `hosts:` entry named `name` (UsageError when it names none)."""
    _, hosts = _hosts_node(text)
    if not isinstance(hosts, yaml.SequenceNode):
        raise UsageError(f"no host named {name!r} in {user_file()}", hint="`vmsandbox host ls` lists them")
    items = hosts.value
    for i, item in enumerate(items):
        if not isinstance(item, yaml.MappingNode):
            continue
        named = {k.value: v for k, v in item.value if isinstance(k, yaml.ScalarNode)}
        if not (isinstance(named.get("name"), yaml.ScalarNode) and named["name"].value == name):
            continue
        if hosts.flow_style:
            kept = [yaml.safe_load(text[n.start_mark.index : n.end_mark.index]) for j, n in enumerate(items) if j != i]
            return text[: hosts.start_mark.index] + json.dumps(kept) + text[hosts.end_mark.index :]
        start = text.rfind("\n", 0, item.start_mark.index) + 1
        if i + 1 < len(items):
            end = text.rfind("\n", 0, items[i + 1].start_mark.index) + 1
        else:
            end = _line_after(text, _last_scalar(item).end_mark.index)
        if len(items) == 1:  # the list goes with its one entry
            start = text.rfind("\n", 0, text.rindex("hosts", 0, hosts.start_mark.index)) + 1
        return text[:start] + text[end:]
    raise UsageError(f"no host named {name!r} in {user_file()}", hint="`vmsandbox host ls` lists them")


def _last_scalar(node: yaml.Node) -> yaml.Node:
    """The last scalar written in a node (a block node's own end mark lies past the comments after it)."""
    while isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.value:
        last = node.value[-1]
        node = last[1] if isinstance(node, yaml.MappingNode) else last
    return node


def _line_after(text: str, index: int) -> int:
    if index > 0 and text[index - 1] == "\n":
        return index
    at = text.find("\n", index)
    return len(text) if at < 0 else at + 1


def add(entry: dict[str, Any]) -> None:
    """An entry added to `hosts:` of your config (checked as the config is read, then written in one go)."""
    if entry.get("name") == LOCAL:
        raise UsageError(f"`{LOCAL}` is this machine's name", hint="give the host another name")
    path = user_file()
    text = path.read_text() if path.exists() else ""
    _write(path, text, added(text, entry))


def remove(name: str) -> None:
    """The entry named `name` taken off `hosts:` of your config."""
    path = user_file()
    text = path.read_text() if path.exists() else ""
    _write(path, text, removed(text, name))


def _write(path: Path, old: str, new: str) -> None:
    try:
        settings.read_config_text(old, str(path))
    except VmsandboxError as exc:
        raise VmsandboxError(
            f"{path} has problems already; it is left as it is", hint="`vmsandbox config validate` lists them"
        ) from exc
    try:
        settings.read_config_text(new, str(path))
    except VmsandboxError as exc:
        raise UsageError(exc.message, hint=exc.hint) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    filewrite.write_atomically(path, new)
