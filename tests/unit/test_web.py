"""The web review's guard (its own address, one-time tickets, the cookie, where a request comes from, Origin,
headers) on an app that only says hello; nothing is served on a socket (starlette's TestClient calls the app
in process)."""

from __future__ import annotations

import ipaddress
import warnings

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from vmsandbox.web.pageguard import CSP, TICKET_SECONDS, Guard, loopback_address

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

PORT = 8123
ADDRESS = "127.45.6.7"
HOST = f"{ADDRESS}:{PORT}"
PAGE = {"Host": HOST, "Sec-Fetch-Site": "same-origin"}


def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


@pytest.fixture
def guard() -> Guard:
    app = Starlette(routes=[Route("/", hello, methods=["GET", "POST"])])
    return Guard(app, address=ADDRESS, port=PORT)


@pytest.fixture
def client(guard: Guard) -> TestClient:
    return TestClient(guard, base_url=f"http://{HOST}", follow_redirects=False)


def _cookie(guard: Guard, client: TestClient) -> dict[str, str]:
    """The cookie a browser holds after opening a URL `vmsandbox ui` printed."""
    answer = client.get(guard.url("/"), headers={"Host": HOST, "Sec-Fetch-Site": "none"})
    name, _, rest = answer.headers["set-cookie"].partition("=")
    return {"Cookie": f"{name}={rest.split(';')[0]}"}


def test_the_page_has_an_address_of_its_own() -> None:
    """Not 127.0.0.1, where the guests' published ports are: a cookie of another host never goes there."""
    for _ in range(200):
        address = ipaddress.ip_address(loopback_address())
        assert address.is_loopback and address not in ipaddress.ip_network("127.0.0.0/24")


def test_a_ticket_works_once_and_becomes_a_strict_cookie_the_url_never_holds(guard: Guard, client: TestClient) -> None:
    url = guard.url("/")
    answer = client.get(url.replace("/?", "/?x=1&"), headers={"Host": HOST, "Sec-Fetch-Site": "cross-site"})
    assert answer.status_code == 200  # (opened from the launcher file: another site for the browser)
    assert 'content="0;url=/?x=1"' in answer.text
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"vmsandbox_ui_{PORT}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Domain" not in cookie
    value = cookie.split(";")[0].partition("=")[2]
    assert value not in url and len(value) >= 32  # the cookie's secret is never in a URL
    came_back = client.get("/", headers={**PAGE, "Cookie": f"vmsandbox_ui_{PORT}={value}"})
    assert came_back.status_code == 200  # the browser came back with the cookie: the ticket is spent now
    again = client.get(url, headers={"Host": HOST})
    assert again.status_code == 403 and "used already" in again.text
    fetched = client.get(guard.url("/"), headers={"Host": HOST, "Sec-Fetch-Mode": "cors"})
    assert fetched.status_code == 403  # a ticket opens the page; a script's fetch cannot spend one


def test_without_the_cookie_nothing_is_served(guard: Guard, client: TestClient) -> None:
    assert client.get("/", headers=PAGE).status_code == 403
    assert client.get("/?ticket=wrong", headers=PAGE).status_code == 403
    assert client.get("/", headers={**PAGE, "Cookie": f"vmsandbox_ui_{PORT}=wrong"}).status_code == 403
    good = client.get("/", headers={**PAGE, **_cookie(guard, client)})
    assert (good.status_code, good.text) == (200, "hello")


@pytest.mark.parametrize(
    "host", ["evil.example", f"evil.example:{PORT}", f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"{ADDRESS}:1", ""]
)
def test_another_host_name_is_refused_even_with_the_cookie(guard: Guard, client: TestClient, host: str) -> None:
    cookie = _cookie(guard, client)
    assert client.get("/", headers={**PAGE, **cookie, "Host": host}).status_code == 403


@pytest.mark.parametrize("site", ["same-site", "cross-site"])
def test_another_page_reads_nothing_and_changes_nothing(guard: Guard, client: TestClient, site: str) -> None:
    """A page a guest serves on a published port is another site (and another host) for the browser: even
    holding the cookie, its GETs (which would start a fetch from a guest) are refused, and so are its POSTs."""
    cookie = _cookie(guard, client)
    assert client.get("/", headers={**cookie, "Host": HOST, "Sec-Fetch-Site": site}).status_code == 403
    post = {**cookie, "Host": HOST, "Sec-Fetch-Site": site, "Origin": f"http://{HOST}"}
    assert client.post("/", headers=post).status_code == 403


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-origin"}, 200),
        ({"Origin": f"http://{HOST}"}, 200),  # a browser that does not say where it comes from: Origin says
        ({}, 403),  # no Origin: not the page (a client that is not a browser gets nothing done)
        ({"Origin": f"http://127.0.0.1:{PORT}"}, 403),
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Origin": f"http://{HOST}", "Sec-Fetch-Site": "none"}, 403),  # typed: a POST never is
    ],
)
def test_a_change_must_come_from_the_page(
    guard: Guard, client: TestClient, headers: dict[str, str], status: int
) -> None:
    answer = client.post("/", headers={"Host": HOST, **_cookie(guard, client), **headers})
    assert answer.status_code == status


def test_every_answer_carries_the_strict_headers(guard: Guard, client: TestClient) -> None:
    for answer in (
        client.get("/", headers=PAGE),
        client.get("/", headers={**PAGE, **_cookie(guard, client)}),
        client.get(guard.url("/"), headers=PAGE),
    ):
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-frame-options"] == "DENY"


def test_the_browser_is_opened_on_a_file_only_this_account_reads() -> None:
    """The ticket never goes on the browser's command line (/proc/PID/cmdline is every account's to read)."""
    import stat

    from vmsandbox.web import server

    url = f"http://{HOST}/?ticket=abc&x=<1>"
    launcher = server.launcher_file(url)
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o600
    assert stat.S_IMODE(launcher.parent.stat().st_mode) == 0o700
    assert launcher.as_uri().startswith("file://") and "abc" not in launcher.as_uri()
    assert 'url=http://127.45.6.7:8123/?ticket=abc&amp;x=&lt;1&gt;"' in launcher.read_text()


def test_a_ticket_spends_the_others_and_an_unused_one_expires(
    guard: Guard, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The printed URL and the launcher's are given out together: one opens the page, the other nothing after;
    an unused ticket expires; and the page sent on is never another site's (`//evil.example/`)."""
    import time

    printed, launcher = guard.url("/"), guard.url("/")
    assert client.get(launcher, headers={"Host": HOST}).status_code == 200
    assert client.get("/", headers=PAGE).status_code == 200  # (the client's jar holds the cookie: it came back)
    assert client.get(printed, headers={"Host": HOST}).status_code == 403
    late = guard.url("/")
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + TICKET_SECONDS + 1)
    assert client.get(late, headers={"Host": HOST}).status_code == 403
    monkeypatch.setattr(time, "monotonic", lambda: now)
    ticket = guard.url("/").rpartition("ticket=")[2]
    answer = client.get(f"http://{HOST}//evil.example/x?ticket={ticket}", headers={"Host": HOST})
    assert answer.status_code == 200 and 'url=/evil.example/x"' in answer.text, answer.text


def test_an_exchange_whose_answer_never_reached_a_browser_spends_nothing(guard: Guard) -> None:
    """A request that waited until the browser gave up (a page starved by another account's connections) is
    answered to nobody: the URL still opens the page when the person tries again, and once a browser came back
    with its cookie, every other cookie handed out for it is worth nothing and the URL opens nothing more."""
    url = guard.url("/")
    lost = TestClient(guard, base_url=f"http://{HOST}", follow_redirects=False)
    assert lost.get(url, headers={"Host": HOST}).status_code == 200  # (its answer reached nobody)
    browser = TestClient(guard, base_url=f"http://{HOST}", follow_redirects=False)
    assert browser.get(url, headers={"Host": HOST}).status_code == 200  # the same URL, tried again
    assert browser.get("/", headers=PAGE).text == "hello"
    assert lost.get("/", headers=PAGE).status_code == 403  # the cookie of the lost answer: spent with the ticket
    assert TestClient(guard).get(url, headers={"Host": HOST}).status_code == 403
    assert browser.get("/", headers=PAGE).text == "hello"


def test_a_url_of_a_page_with_a_query_carries_its_ticket_beside_it(guard: Guard) -> None:
    """`run --review web` gives the page of the frozen review (`/s/NAME?review=ID`): its ticket is one more
    parameter (a second `?` made it part of the review's id, and the page refused the browser)."""
    url = guard.url("/s/x?review=abc")
    assert url.startswith(f"http://{HOST}/s/x?review=abc&ticket=") and url.count("?") == 1
