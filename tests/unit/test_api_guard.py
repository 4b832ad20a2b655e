"""Who may use the API, and how a refusal reads: another host name, a web page, another local account (on
127.0.0.1 and on the Unix socket), no key or a wrong one; envd's Connect side refusing what it does not speak;
the OpenAPI description; an unknown endpoint."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.unit.apiserver import Served, served
from vmsandbox.api import peer
from vmsandbox.api.keyguard import Keys
from vmsandbox.core.door import gate, kernel
from vmsandbox.core.sandbox.names import SessionName


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Served]:
    with served(tmp_path / "guests") as s:
        yield s


def test_another_host_name_is_refused_before_the_key(api: Served) -> None:
    answer = httpx.get(f"{api.url}/v2/sandboxes", headers=api.headers | {"Host": f"evil.example:{api.port}"})
    assert answer.status_code == 403 and answer.json()["message"].startswith("this API answers on 127.0.0.1 only")
    assert httpx.get(f"http://localhost:{api.port}/v2/sandboxes", headers=api.headers).status_code == 200


@pytest.mark.parametrize("header", [{"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}])
def test_a_web_page_is_refused_even_with_the_key(api: Served, header: dict[str, str]) -> None:
    answer = httpx.get(f"{api.url}/v2/sandboxes", headers=api.headers | header)
    assert answer.status_code == 403 and "from a program" in answer.json()["hint"]
    assert "access-control-allow-origin" not in answer.headers
    preflight = httpx.options(f"{api.url}/v2/sandboxes", headers={"Origin": "https://evil.example"})
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


def test_no_key_or_a_wrong_one(api: Served) -> None:
    answer = httpx.get(f"{api.url}/openapi.json")
    assert answer.status_code == 401 and answer.json() == {
        "code": 401,
        "message": answer.json()["message"],
        "hint": "set E2B_API_KEY to the key `vmsandbox serve` printed (it changes each time serve starts)",
    }
    wrong = httpx.get(f"{api.url}/openapi.json", headers={"X-API-Key": api.key + "x"})
    assert wrong.status_code == 401 and wrong.json()["message"].startswith("not the API key")
    assert api.key not in wrong.text


def test_another_account_is_refused_whatever_it_sends(api: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer, "OWNER", os.geteuid() + 1)  # (this account, as another one would be seen)
    answer = httpx.get(f"{api.url}/v2/sandboxes", headers=api.headers)
    assert answer.status_code == 403
    assert answer.json()["message"].startswith(f"a connection from uid {os.geteuid()}")
    monkeypatch.setattr(peer, "OWNER", os.geteuid())
    monkeypatch.setattr(kernel, "tcp_holder", lambda *_: None)  # not found: refused too
    answer = httpx.get(f"{api.url}/v2/sandboxes", headers=api.headers)
    assert answer.status_code == 403 and "an account that could not be found" in answer.json()["message"]


def test_another_accounts_connection_is_answered_and_closed_as_it_is_made(
    api: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection of another account that sends nothing is answered 403 and closed at once: a thousand of them
    hold none of serve's descriptors."""
    monkeypatch.setattr(peer, "OWNER", os.geteuid() + 1)
    held = [socket.create_connection(("127.0.0.1", api.port)) for _ in range(50)]
    for s in held:
        s.settimeout(10)
        answer = b""
        while chunk := s.recv(4096):  # (to the end: the server closed it)
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 403") and b"this API serves only the account" in answer
        s.close()


def test_a_connection_that_sends_no_whole_head_is_closed_in_time(api: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "HEAD_TIMEOUT", 0.5)
    with (
        socket.create_connection(("127.0.0.1", api.port)) as quiet,
        socket.create_connection(("127.0.0.1", api.port)) as slow,
    ):
        slow.sendall(b"GET /v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never the blank line
        for s in (quiet, slow):
            s.settimeout(10)
            assert s.recv(4096) == b""  # closed by the server, not left waiting
    assert httpx.get(f"{api.url}/v2/sandboxes", headers=api.headers).status_code == 200


def test_the_ipv6_twin_of_the_port_is_held_and_served_to_this_account_only(
    api: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client told `localhost` may try ::1 first: serve holds [::1]:PORT too, so no other account can listen
    there for the key, and answers there as on 127.0.0.1, to this account only."""
    if not socket.has_ipv6 or not Path("/proc/net/tcp6").exists():
        pytest.skip("no IPv6 loopback on this machine")
    squat = socket.socket(socket.AF_INET6)
    with squat, pytest.raises(OSError):
        squat.bind(("::1", api.port))
    answer = httpx.get(f"http://[::1]:{api.port}/v2/sandboxes", headers=api.headers | {"Host": f"localhost:{api.port}"})
    assert answer.status_code == 200
    monkeypatch.setattr(peer, "OWNER", os.geteuid() + 1)  # (as another account would be seen)
    answer = httpx.get(f"http://[::1]:{api.port}/v2/sandboxes", headers=api.headers | {"Host": f"localhost:{api.port}"})
    assert answer.status_code == 403


def test_envd_speaks_connects_json_only(api: Served) -> None:
    name = SessionName("some-sandbox")
    made = api.backend.adopt(name)
    headers = {
        "E2b-Sandbox-Id": name.value,
        "X-Access-Token": Keys(api.key, api.backend.born).envd_token(name, made.started_at),
    }
    url = f"{api.url}/process.Process/List"
    binary = httpx.post(url, content=b"", headers=headers | {"Content-Type": "application/proto"})
    assert binary.status_code == 501 and binary.json()["code"] == "unimplemented"
    assert "JSON codec" in binary.json()["message"]
    api.backend.kill(name)
    gone = httpx.post(url, content=b"{}", headers=headers | {"Content-Type": "application/json"})
    assert gone.status_code == 503 and gone.json()["code"] == "unavailable"
    assert "was not found running" in gone.json()["message"]
    health = httpx.get(f"{api.url}/health", headers=headers)
    assert health.status_code == 502 and "was not found running" in health.json()["message"]
    bad = httpx.post(url, content=b"{}", headers=headers | {"E2b-Sandbox-Id": "../x"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument"


def test_openapi_describes_the_control_plane_the_extension_and_envds_files(api: Served) -> None:
    doc = httpx.get(f"{api.url}/openapi.json", headers=api.headers).json()
    assert doc["openapi"].startswith("3.1")
    paths = doc["paths"]
    assert {"post", "get"} <= set(paths["/v2/sandboxes"])
    assert "post" in paths["/vmsandbox/v1/sessions/{name}/reviews/{review}/apply"]
    assert {"get", "post"} <= set(paths["/files"])
    schemas = doc["components"]["schemas"]
    assert {"NewSandbox", "SandboxOut", "ReviewOut", "ApplyIn", "ErrorOut"} <= set(schemas)
    assert "templateID" in schemas["NewSandbox"]["properties"]


def test_an_unknown_endpoint_is_json_naming_the_description(api: Served) -> None:
    answer = httpx.get(f"{api.url}/nowhere", headers=api.headers)
    assert answer.status_code == 404 and answer.json()["hint"] == "/openapi.json lists what is served"
    answer = httpx.put(f"{api.url}/v2/sandboxes", headers=api.headers)
    assert answer.status_code == 405
