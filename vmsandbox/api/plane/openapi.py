"""The API's OpenAPI 3.1 description (`GET /openapi.json`): E2B's control plane as served here, envd's file
endpoints, and the extension. Schemas come from the wire models themselves (controlwire.py, extwire.py), so the
description cannot drift from what is checked and sent. envd's Connect services are named in the description
(they are RPC, described by E2B's protos, not paths)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from vmsandbox import __version__
from vmsandbox.api.plane import controlwire, extwire
from vmsandbox.api.plane.extension import PREFIX

# (method, path, summary, request body, answer, status, answers a list)
Op = tuple[str, str, str, type[BaseModel] | None, type[BaseModel] | None, int, bool]
CONTROL: tuple[Op, ...] = (
    (
        "post",
        "/v2/sandboxes",
        "Create a sandbox (a session) from a blueprint or a snapshot",
        controlwire.NewSandbox,
        controlwire.SandboxOut,
        201,
        False,
    ),
    ("get", "/v2/sandboxes", "List running and paused sandboxes", None, controlwire.ListedSandboxOut, 200, True),
    ("get", "/sandboxes/{sandboxID}", "A sandbox", None, controlwire.SandboxDetailOut, 200, False),
    ("delete", "/sandboxes/{sandboxID}", "End a sandbox (its changes kept in the outbox)", None, None, 204, False),
    ("post", "/sandboxes/{sandboxID}/pause", "Pause (stop with memory kept)", None, None, 204, False),
    (
        "post",
        "/v2/sandboxes/{sandboxID}/connect",
        "Resume or reach a sandbox",
        controlwire.ConnectRequest,
        controlwire.SandboxOut,
        201,
        False,
    ),
    (
        "post",
        "/sandboxes/{sandboxID}/timeout",
        "Set when it ends, from now",
        controlwire.TimeoutRequest,
        None,
        204,
        False,
    ),
    (
        "post",
        "/sandboxes/{sandboxID}/snapshots",
        "Take a checkpoint",
        controlwire.SnapshotRequest,
        controlwire.SnapshotOut,
        201,
        False,
    ),
    ("get", "/snapshots", "List checkpoints", None, controlwire.SnapshotOut, 200, True),
    (
        "post",
        "/sandboxes/{sandboxID}/fork",
        "Fork a sandbox as it is now",
        controlwire.ForkRequest,
        controlwire.ForkResultOut,
        201,
        True,
    ),
)
EXTENSION: tuple[Op, ...] = (
    (
        "post",
        "/sessions",
        "Create a session on a project of this machine",
        extwire.NewSession,
        extwire.SessionOut,
        201,
        False,
    ),
    ("get", "/sessions", "List sessions", None, extwire.SessionOut, 200, True),
    ("get", "/sessions/{name}", "A session", None, extwire.SessionOut, 200, False),
    (
        "post",
        "/sessions/{name}/reviews",
        "Read its changes as a frozen review (its first page)",
        None,
        extwire.ReviewOut,
        201,
        False,
    ),
    (
        "get",
        "/sessions/{name}/reviews/{review}",
        "A page of a review, as it was read (nextToken, limit)",
        None,
        extwire.ReviewOut,
        200,
        False,
    ),
    (
        "post",
        "/sessions/{name}/reviews/{review}/apply",
        "Apply chosen items or hunks of a review",
        extwire.ApplyIn,
        extwire.AppliedOut,
        200,
        False,
    ),
    ("get", "/sessions/{name}/checkpoints", "Its checkpoints", None, extwire.CheckpointOut, 200, True),
    (
        "post",
        "/sessions/{name}/checkpoints",
        "Take a checkpoint",
        extwire.CheckpointIn,
        extwire.CheckpointOut,
        201,
        False,
    ),
    (
        "post",
        "/sessions/{name}/rollback",
        "Roll back to a checkpoint",
        extwire.RollbackIn,
        extwire.SessionOut,
        200,
        False,
    ),
    (
        "post",
        "/sessions/{name}/fork",
        "Fork from a checkpoint or as it is now",
        extwire.ForkIn,
        extwire.SessionOut,
        201,
        False,
    ),
)
DESCRIPTION = (
    "vmsandbox's API: E2B's control plane and envd (process.Process, filesystem.Filesystem over Connect with "
    "the JSON codec; /files, /health) for E2B's SDKs, and vmsandbox's extension under " + PREFIX + ". "
    "Control plane and extension: X-API-Key. envd: X-Access-Token (from create or connect) and E2b-Sandbox-Id."
)
REF = "#/components/schemas/{model}"


def _schemas() -> tuple[dict[Any, Any], dict[str, Any]]:
    models = {m for ops in (CONTROL, EXTENSION) for op in ops for m in (op[3], op[4]) if m is not None}
    models.add(controlwire.ErrorOut)
    keys, found = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=REF, by_alias=True
    )
    return keys, found.get("$defs", {})


def _operation(op: Op, refs: dict[Any, Any], tag: str) -> dict[str, Any]:
    _method, path, summary, request, answer, status, many = op
    params = [p.strip("{}") for p in path.split("/") if p.startswith("{")]
    error = {"content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorOut")}}}}
    responses: dict[str, Any] = {"default": {"description": "an error, with the fix", **error}}
    if answer is None:
        responses[str(status)] = {"description": "done"}
    else:
        schema = refs[(answer, "validation")]
        schema = {"type": "array", "items": schema} if many else schema
        responses[str(status)] = {"description": summary, "content": {"application/json": {"schema": schema}}}
    found: dict[str, Any] = {
        "summary": summary,
        "tags": [tag],
        "security": [{"ApiKey": []}],
        "parameters": [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params],
        "responses": responses,
    }
    if request is not None:
        body = {"application/json": {"schema": refs[(request, "validation")]}}
        found["requestBody"] = {"required": False, "content": body}
    return found


def _envd_paths() -> dict[str, Any]:
    token: list[dict[str, list[str]]] = [{"AccessToken": [], "SandboxId": []}]
    query = [
        {"name": "path", "in": "query", "required": True, "schema": {"type": "string"}},
        {"name": "username", "in": "query", "required": False, "schema": {"type": "string"}},
    ]
    return {
        "/health": {"get": {"summary": "204 while the sandbox runs", "tags": ["envd"], "security": token,
                            "responses": {"204": {"description": "running"}, "502": {"description": "not running"}}}},
        "/files": {
            "get": {"summary": "A file's content", "tags": ["envd"], "security": token, "parameters": query,
                    "responses": {"200": {"description": "the content",
                                          "content": {"application/octet-stream": {}}}}},
            "post": {"summary": "Write files (multipart/form-data or application/octet-stream)", "tags": ["envd"],
                     "security": token, "parameters": query, "responses": {"200": {"description": "written"}}},
        },
    }  # fmt: skip


def document() -> dict[str, Any]:
    refs, schemas = _schemas()
    paths: dict[str, Any] = {}
    for ops, prefix, tag in ((CONTROL, "", "sandboxes"), (EXTENSION, PREFIX, "vmsandbox")):
        for op in ops:
            paths.setdefault(prefix + op[1], {})[op[0]] = _operation(op, refs, tag)
    paths |= _envd_paths()
    return {
        "openapi": "3.1.0",
        "info": {"title": "vmsandbox", "version": __version__, "description": DESCRIPTION},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "AccessToken": {"type": "apiKey", "in": "header", "name": "X-Access-Token"},
                "SandboxId": {"type": "apiKey", "in": "header", "name": "E2b-Sandbox-Id"},
            },
        },
    }
