"""E2B's control-plane JSON (its OpenAPI's Sandbox, ListedSandbox, SandboxDetail, NewSandbox, SnapshotInfo,
Error), as pydantic models: they check what comes in, shape what goes out, and give openapi.py its schemas.

Unknown fields are ignored (a newer SDK may send more); fields E2B has and vmsandbox does not serve are read
only to be refused by the handler with what to do instead.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vmsandbox.core.sandbox.model import Checkpoint, Sandbox
from vmsandbox.core.sandbox.names import InvalidError

ENVD_VERSION = "0.5.7"  # the envd features served: stdin choice and closing (0.3.0, 0.5.2), default user (0.4.0),
# octet-stream uploads (0.5.7); not file metadata (0.6.2), which E2B's SDK then refuses on its own side
CLIENT_ID = "vmsandbox"  # E2B's deprecated clientID, still required in its schema
MAX_TIMEOUT = 7 * 24 * 3600  # seconds a session may be given at once
DEFAULT_TIMEOUT = 300  # E2B's SDK default
MAX_METADATA = 64
MAX_ENVS = 1024
# The domain E2B's SDK is told a sandbox lives under. It uses it only where E2B_SANDBOX_URL is not set, to build
# `https://49983-SANDBOX.DOMAIN`: a name in `.invalid` (RFC 6761) resolves nowhere, and no public CA certifies one,
# so a client missing that variable fails on this machine instead of sending a command, a file or the envd token
# to E2B's cloud (`sandbox.e2b.app`, its fallback for no domain). The name says the fix in the SDK's error.
SANDBOX_DOMAIN = "set-e2b-sandbox-url.invalid"


Key = Annotated[str, Field(min_length=1, max_length=256)]
Value = Annotated[str, Field(max_length=64 * 1024)]


class Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class NewSandbox(Wire):
    template_id: str = Field(alias="templateID", max_length=200)
    timeout: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT)
    metadata: dict[Key, Value] | None = Field(default=None, max_length=MAX_METADATA)
    env_vars: dict[Key, Value] | None = Field(default=None, alias="envVars", max_length=MAX_ENVS)
    # E2B's, refused when asked for (control.py says why)
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    auto_resume: Any = Field(default=None, alias="autoResume")
    allow_internet_access: bool | None = None
    network: Any = None
    mcp: Any = None
    iam: Any = None
    volume_mounts: list[Any] | None = Field(default=None, alias="volumeMounts")


class ConnectRequest(Wire):
    timeout: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT)


class TimeoutRequest(Wire):
    timeout: int = Field(ge=1, le=MAX_TIMEOUT)


class SnapshotRequest(Wire):
    name: str | None = Field(default=None, max_length=80)


class ForkRequest(Wire):
    timeout: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT)
    count: int = Field(default=1, ge=1, le=8)


class SandboxOut(Wire):
    """What create, connect and fork answer: enough to reach the sandbox's envd."""

    template_id: str = Field(alias="templateID")
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(default=CLIENT_ID, alias="clientID")
    envd_version: str = Field(default=ENVD_VERSION, alias="envdVersion")
    envd_access_token: str = Field(alias="envdAccessToken")
    domain: str = SANDBOX_DOMAIN


class ListedSandboxOut(Wire):
    template_id: str = Field(alias="templateID")
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(default=CLIENT_ID, alias="clientID")
    started_at: datetime = Field(alias="startedAt")
    end_at: datetime = Field(alias="endAt")
    cpu_count: int = Field(alias="cpuCount")
    memory_mb: int = Field(alias="memoryMB")
    disk_size_mb: int = Field(alias="diskSizeMB")
    metadata: dict[str, str]
    state: str
    envd_version: str = Field(default=ENVD_VERSION, alias="envdVersion")


class SandboxDetailOut(ListedSandboxOut):
    envd_access_token: str = Field(alias="envdAccessToken")
    domain: str = SANDBOX_DOMAIN


class SnapshotOut(Wire):
    snapshot_id: str = Field(alias="snapshotID")
    names: list[str]


class ForkResultOut(Wire):
    sandbox: SandboxOut | None = None
    error: ErrorOut | None = None


class ErrorOut(Wire):
    code: int
    message: str
    hint: str | None = None


ForkResultOut.model_rebuild()


M = TypeVar("M", bound=BaseModel)


def read(model: type[M], data: Any) -> M:
    """A request body as `model`, or a 400 naming each field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise InvalidError(f"the request body is not a {model.__name__}: {wrong}", hint="see /openapi.json") from None


def dump(model: Wire) -> dict[str, Any]:
    found: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return found


def sandbox(s: Sandbox, token: str) -> SandboxOut:
    return SandboxOut(templateID=s.blueprint, sandboxID=s.name.value, envdAccessToken=token)


def listed(s: Sandbox) -> ListedSandboxOut:
    return ListedSandboxOut(**_listed_fields(s))


def detail(s: Sandbox, token: str) -> SandboxDetailOut:
    return SandboxDetailOut(**_listed_fields(s), envdAccessToken=token)


def _listed_fields(s: Sandbox) -> dict[str, Any]:
    return {
        "templateID": s.blueprint,
        "sandboxID": s.name.value,
        "startedAt": s.started_at,
        "endAt": s.end_at,
        "cpuCount": s.cpus,
        "memoryMB": s.memory_mib,
        "diskSizeMB": s.disk_mib,
        "metadata": dict(s.metadata),
        "state": s.state.value,
    }


def snapshot(c: Checkpoint) -> SnapshotOut:
    return SnapshotOut(snapshotID=str(c.snapshot), names=[c.snapshot.label.value])


PAGE = 100  # the most rows a page of a listing holds


def page_of(token: str | None, limit: str | None, *, most: int = PAGE) -> tuple[int, int]:
    """Where a page starts and how many rows it may hold, from a client's `nextToken` and `limit`."""
    for given in (token, limit):
        if given and not (given.isascii() and given.isdigit() and len(given) <= 9):
            raise InvalidError("nextToken and limit are counts", hint="pass back the nextToken the last page gave")
    return int(token or 0), max(1, min(int(limit or most), most))
