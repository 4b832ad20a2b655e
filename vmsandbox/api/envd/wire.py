"""envd's protobuf messages in protobuf's JSON mapping (what E2B's SDKs send: Connect's JSON codec), read and
written by hand: a field by its lowerCamel name or its proto name, bytes as base64, int64 as a decimal string,
enums by name (or number), a Timestamp as RFC 3339. Reading is strict about types (a wrong one is a 400 naming
the field) and lenient about fields it does not know, as protobuf's parsers are asked to be.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from vmsandbox.core.sandbox.model import Entry, EntryType, Exit, ProcessInfo, ProcessSpec, Signal
from vmsandbox.core.sandbox.names import GuestPath, InvalidError, tag

Message = dict[str, Any]

MAX_ARGS = 4096
MAX_ENVS = 1024
ENTRY_TYPES = {
    EntryType.FILE: "FILE_TYPE_FILE",
    EntryType.DIR: "FILE_TYPE_DIRECTORY",
    EntryType.SYMLINK: "FILE_TYPE_SYMLINK",
    EntryType.OTHER: "FILE_TYPE_UNSPECIFIED",
}
SIGNALS = {"SIGNAL_SIGTERM": Signal.TERM, "SIGNAL_SIGKILL": Signal.KILL, 15: Signal.TERM, 9: Signal.KILL}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def field(message: Mapping[str, Any], name: str) -> Any:
    """A field by its JSON name or its proto name; None when absent (or JSON null, which protobuf reads so)."""
    value = message.get(_camel(name))
    return message.get(name) if value is None else value


def _wrong(name: str, what: str) -> InvalidError:
    return InvalidError(f"field `{_camel(name)}` must be {what}", hint="send the message as E2B's SDK builds it")


def text(message: Mapping[str, Any], name: str, default: str = "") -> str:
    value = field(message, name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _wrong(name, "a string")
    return value


def optional_text(message: Mapping[str, Any], name: str) -> str | None:
    return None if field(message, name) is None else text(message, name)


INT64 = (-(2**63), 2**63 - 1)  # the widest integer a protobuf field holds
DECIMAL = re.compile(r"-?[0-9]{1,19}")  # as protobuf's JSON writes an int64: ASCII digits (`isdigit` takes "²")


def integer(message: Mapping[str, Any], name: str, default: int = 0) -> int:
    """An integer field: a JSON number or a decimal string of ASCII digits, within 64 bits; anything else is a 400
    naming the field (never a 500 from `int()`)."""
    value = field(message, name)
    if value is None:
        return default
    if isinstance(value, str):
        if not DECIMAL.fullmatch(value):
            raise _wrong(name, "an integer (ASCII digits, at most 19)")
        value = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(name, "an integer")
    if not INT64[0] <= value <= INT64[1]:
        raise _wrong(name, "an integer of at most 64 bits")
    return value


def boolean(message: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = field(message, name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _wrong(name, "true or false")
    return value


def child(message: Mapping[str, Any], name: str) -> Message | None:
    value = field(message, name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _wrong(name, "an object")
    return value


def raw_bytes(message: Mapping[str, Any], name: str) -> bytes | None:
    value = field(message, name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _wrong(name, "base64 text")
    try:
        padded = value + "=" * (-len(value) % 4)
        return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise _wrong(name, "base64 text") from None


def strings(message: Mapping[str, Any], name: str, most: int) -> tuple[str, ...]:
    value = field(message, name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _wrong(name, "a list of strings")
    if len(value) > most:
        raise _wrong(name, f"at most {most} strings")
    return tuple(value)


def string_map(message: Mapping[str, Any], name: str, most: int) -> dict[str, str]:
    value = field(message, name) or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _wrong(name, "an object of strings")
    if len(value) > most:
        raise _wrong(name, f"at most {most} entries")
    return dict(value)


def guest_path(message: Mapping[str, Any], name: str) -> GuestPath:
    return GuestPath(text(message, name))


def process_spec(start: Mapping[str, Any], timeout: float | None) -> ProcessSpec:
    """A StartRequest's ProcessConfig (and stdin, tag) as a spec; the user comes from the request's header."""
    config = child(start, "process") or {}
    cwd = optional_text(config, "cwd")
    tagged = optional_text(start, "tag")
    return ProcessSpec(
        cmd=text(config, "cmd"),
        args=strings(config, "args", MAX_ARGS),
        envs=string_map(config, "envs", MAX_ENVS),
        cwd=GuestPath(cwd) if cwd else None,
        stdin=boolean(start, "stdin", default=True),  # envd: absent means true (older SDKs)
        tag=tag(tagged) if tagged is not None else None,
        timeout=timeout,
    )


def signal(message: Mapping[str, Any]) -> Signal:
    value = field(message, "signal")
    found = SIGNALS.get(value) if isinstance(value, str | int) else None
    if found is None:
        raise _wrong("signal", "SIGNAL_SIGTERM or SIGNAL_SIGKILL")
    return found


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def process_info(info: ProcessInfo) -> Message:
    config: Message = {"cmd": info.spec.cmd, "args": list(info.spec.args), "envs": dict(info.spec.envs)}
    if info.spec.cwd is not None:
        config["cwd"] = info.spec.cwd.value
    found: Message = {"config": config, "pid": info.pid}
    if info.spec.tag is not None:
        found["tag"] = info.spec.tag
    return found


def end_event(end: Exit) -> Message:
    event: Message = {"exitCode": end.code, "exited": True, "status": end.status}
    if end.error is not None:
        event["error"] = end.error
    return {"event": {"end": event}}


def entry(e: Entry) -> Message:
    found: Message = {
        "name": e.name,
        "type": ENTRY_TYPES[e.type],
        "path": e.path,
        "size": str(e.size),
        "mode": e.mode,
        "permissions": e.permissions,
        "owner": e.owner,
        "group": e.group,
        "modifiedTime": timestamp(e.modified),
    }
    if e.symlink_target is not None:
        found["symlinkTarget"] = e.symlink_target
        found["isSymlink"] = e.type is EntryType.SYMLINK
    return found
