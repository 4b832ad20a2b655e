"""The web review's guard (token, Host, Origin, headers) on an app that only says hello; nothing is served
on a socket (starlette's TestClient calls the app in process)."""

from __future__ import annotations

import warnings

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from vmsandbox.web.guard import COOKIE, CSP, Guard

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

PORT = 8123
HOST = f"127.0.0.1:{PORT}"


def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


@pytest.fixture
def client() -> TestClient:
    app = Starlette(routes=[Route("/", hello, methods=["GET", "POST"])])
    return TestClient(Guard(app, token="s3cret", port=PORT), base_url=f"http://{HOST}", follow_redirects=False)


def test_the_token_in_the_url_becomes_a_strict_cookie_and_leaves_the_url(client: TestClient) -> None:
    answer = client.get("/?token=s3cret&x=1", headers={"Host": HOST})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/?x=1"
    cookie = answer.headers["set-cookie"]
    assert f"{COOKIE}=s3cret" in cookie
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie


def test_without_the_token_nothing_is_served(client: TestClient) -> None:
    assert client.get("/", headers={"Host": HOST}).status_code == 403
    assert client.get("/?token=wrong", headers={"Host": HOST}).status_code == 403
    assert client.get("/", headers={"Host": HOST, "Cookie": f"{COOKIE}=wrong"}).status_code == 403
    good = client.get("/", headers={"Host": HOST, "Cookie": f"{COOKIE}=s3cret"})
    assert (good.status_code, good.text) == (200, "hello")


@pytest.mark.parametrize("host", ["evil.example", f"evil.example:{PORT}", "127.0.0.1:1", "[::1]:8123", ""])
def test_another_host_name_is_refused_even_with_the_token(client: TestClient, host: str) -> None:
    assert client.get("/", headers={"Host": host, "Cookie": f"{COOKIE}=s3cret"}).status_code == 403


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Origin": f"http://{HOST}"}, 200),
        ({"Origin": f"http://localhost:{PORT}"}, 200),
        ({}, 200),  # no Origin (not a browser): the token is what counts
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Origin": f"http://{HOST}", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Sec-Fetch-Site": "same-site"}, 403),
    ],
)
def test_a_change_must_come_from_the_page(client: TestClient, headers: dict[str, str], status: int) -> None:
    answer = client.post("/", headers={"Host": HOST, "Cookie": f"{COOKIE}=s3cret", **headers})
    assert answer.status_code == status


def test_every_answer_carries_the_strict_headers(client: TestClient) -> None:
    for answer in (
        client.get("/", headers={"Host": HOST}),
        client.get("/", headers={"Host": HOST, "Cookie": f"{COOKIE}=s3cret"}),
    ):
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store"
    assert "script-src 'self'" in CSP
    assert "unsafe-inline" not in CSP
