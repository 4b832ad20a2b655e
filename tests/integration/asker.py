"""The person's requests to a front end, run as the person's account by test_frontdoor_load.py (standard library
only). Prints one JSON list: each request's status and how long it took (the test reports the times and asserts
on the statuses only).

    asker.py api URL KEY COUNT     COUNT requests to the API (its OpenAPI description, behind the key)
    asker.py page URL COUNT        the page's one-time URL opened, then COUNT requests with the cookie it gave
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from urllib.parse import urlsplit

TIMEOUT = 120.0


def _get(url: str, headers: dict[str, str]) -> tuple[int, float, http.client.HTTPResponse]:
    parts = urlsplit(url)
    start = time.monotonic()
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=TIMEOUT)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
        answer = conn.getresponse()
        answer.read()
        return answer.status, time.monotonic() - start, answer
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 0, time.monotonic() - start, None  # type: ignore[return-value]
    finally:
        conn.close()


def api(url: str, key: str, count: int) -> list[tuple[int, float]]:
    return [_get(f"{url}/openapi.json", {"X-API-Key": key})[:2] for _ in range(count)]


def page(url: str, count: int) -> list[tuple[int, float]]:
    status, took, answer = _get(url, {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"})
    found = [(status, took)]
    cookie = (answer.getheader("set-cookie") or "").split(";")[0] if answer is not None else ""
    base = url.split("?", maxsplit=1)[0].rstrip("/")
    for _ in range(count):
        found.append(_get(f"{base}/static/ui.css", {"Cookie": cookie, "Sec-Fetch-Site": "same-origin"})[:2])
    return found


if __name__ == "__main__":
    if sys.argv[1] == "api":
        print(json.dumps(api(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        print(json.dumps(page(sys.argv[2], int(sys.argv[3]))))
