"""envd's side takes only what it can answer for: a sandbox's access token is bound to when that sandbox was
made (a token of an earlier sandbox of the same name opens nothing), and its integers are ASCII decimals within
64 bits — "²" or a 4,301-digit number is a 400 naming the field, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.unit.apiserver import Served, served
from vmsandbox.api.envd import connect, wire
from vmsandbox.api.keyguard import Keys
from vmsandbox.core.sandbox.names import InvalidError, SessionName

LIST = "/process.Process/List"
SIGNAL = "/process.Process/SendSignal"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Served]:
    with served(tmp_path / "guests") as s:
        yield s


def _headers(api: Served, name: SessionName) -> dict[str, str]:
    """What Sandbox.create handed out for the sandbox of that name that exists now."""
    born = api.backend.sandbox(name).started_at
    return {"E2b-Sandbox-Id": name.value, "X-Access-Token": Keys(api.key, api.backend.born).envd_token(name, born)}


def test_a_token_opens_its_own_sandbox_and_no_later_one_of_its_name(api: Served) -> None:
    name = SessionName("sbx-1")
    api.backend.adopt(name)
    first = _headers(api, name)
    assert httpx.post(f"{api.url}{LIST}", content=b"{}", headers=first | JSON).status_code == 200
    api.backend.kill(name)
    api.backend.adopt(name)  # another sandbox, the same name
    stale = httpx.post(f"{api.url}{LIST}", content=b"{}", headers=first | JSON)
    assert stale.status_code == 401 and "no access token for sandbox sbx-1" in stale.json()["message"]
    fresh = _headers(api, name)
    assert fresh != first
    assert httpx.post(f"{api.url}{LIST}", content=b"{}", headers=fresh | JSON).status_code == 200


@pytest.mark.parametrize(
    "pid",
    ['"\u00b2"', '"\u0663"', '"1\\n"', '"+5"', '" 5"', '"' + "9" * 4301 + '"', "9" * 4301, str(2**63), "1.5", "true"],
)
def test_an_integer_that_is_none_is_a_400_naming_it(api: Served, pid: str) -> None:
    name = SessionName("sbx-1")
    api.backend.adopt(name)
    body = f'{{"process": {{"pid": {pid}}}, "signal": "SIGNAL_SIGKILL"}}'.encode()
    answer = httpx.post(f"{api.url}{SIGNAL}", content=body, headers=_headers(api, name) | JSON)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_argument"


def test_integers_in_range_are_read_as_protobuf_writes_them() -> None:
    assert wire.integer({"pid": "42"}, "pid") == 42
    assert wire.integer({"pid": -(2**63)}, "pid") == -(2**63)
    assert wire.integer({"pid": str(2**63 - 1)}, "pid") == 2**63 - 1
    for wrong in ("\u00b2", "\uff11", str(2**63), "", "--1"):
        with pytest.raises(InvalidError, match="field `pid` must be an integer"):
            wire.integer({"pid": wrong}, "pid")


@pytest.mark.parametrize(("header", "value"), [("Connect-Timeout-Ms", "\u00b2"), ("Keepalive-Ping-Interval", "\u00b2")])
def test_a_header_number_that_is_none_is_a_400(api: Served, header: str, value: str) -> None:
    name = SessionName("sbx-1")
    api.backend.adopt(name)
    headers = _headers(api, name) | JSON | {header: value}  # (a header's bytes, as latin-1: "²" is one byte)
    answer = httpx.post(
        f"{api.url}{LIST}", content=b"{}", headers={k.encode(): v.encode("latin-1") for k, v in headers.items()}
    )
    assert answer.status_code == 400, answer.text


def test_a_message_whose_number_python_will_not_read_is_not_json() -> None:
    with pytest.raises(connect.RpcError, match="not JSON"):
        connect.parse(b'{"pid": ' + b"9" * 4301 + b"}")
