"""A secret mapping: which host secret the proxy puts into which header of requests to which host, and the
guest variable that holds a placeholder for it. Written in the user's config, a trusted project config, or a
blueprint; parsed and checked here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vmsandbox.egress import secrets
from vmsandbox.egress.rules import netpolicy
from vmsandbox.errors import VmsandboxError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


@dataclass(frozen=True)
class SecretMapping:
    """A host secret the proxy puts into a header of requests to one host; the guest holds a placeholder."""

    secret: str
    host: str
    header: str
    value: str = "{secret}"  # e.g. "Bearer {secret}" for an Authorization header
    env: str | None = None  # the guest environment variable that gets the placeholder
    required: bool = True  # a session refuses to start while a required secret is not set


def parse_secret_mapping(data: dict[str, Any], *, source: str) -> SecretMapping:
    # here, not above: every session's egress daemon imports this module (its policy's mappings) and never parses
    # one; the config's models (pydantic) and YAML documents cost each daemon ~8 MiB of its own memory
    from vmsandbox.filemodels import SecretEntry
    from vmsandbox.schema import check

    data = check(data, SecretEntry, source=source)
    secrets.validate_name(data["secret"])
    try:
        host = netpolicy.normalize_host(data["host"])
    except netpolicy.Refused as exc:
        raise VmsandboxError(f"{source}: `host`: {exc.reason}", hint="give the API's host name") from None
    if not _HEADER_NAME.match(data["header"]):
        raise VmsandboxError(f"{source}: `header` {data['header']!r} is not a header name")
    value = data.get("value", "{secret}")
    if "{secret}" not in value or any(c in value for c in "\r\n"):
        raise VmsandboxError(f"{source}: `value` must contain {{secret}}, e.g. 'Bearer {{secret}}'")
    env = data.get("env")
    if env is not None and not _ENV_NAME.match(env):
        raise VmsandboxError(f"{source}: `env` {env!r} is not an environment variable name")
    return SecretMapping(data["secret"], host, data["header"], value, env, data.get("required", True))
