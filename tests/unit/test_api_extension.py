"""vmsandbox's extension (/vmsandbox/v1) over the fake backend: a session on a project, driven by E2B's SDK, its
changes read as a frozen review, one hunk applied (the host project holds exactly that hunk), an item the guest
changed after the review refused, checkpoints, rollback and fork; and bad input refused with the fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.apiserver import Served, point_sdk, served

e2b = pytest.importorskip("e2b", reason="E2B's SDK is a dev dependency (pip install -e '.[dev]')")
from e2b import Sandbox  # noqa: E402

V1 = "/vmsandbox/v1"
ORIGINAL = "one\ntwo\nthree\nfour\nfive\n"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    with served(tmp_path / "guests") as s:
        point_sdk(monkeypatch, s)
        yield s


@pytest.fixture
def client(api: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, headers=api.headers) as c:
        yield c


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "a.txt").write_text(ORIGINAL)
    (root / "b.txt").write_text("bee\n")
    return root


def make_session(client: httpx.Client, project: Path) -> dict[str, Any]:
    answer = client.post(f"{V1}/sessions", json={"project": str(project), "name": "proj-1"})
    assert answer.status_code == 201, answer.text
    made: dict[str, Any] = answer.json()
    return made


def edit(name: str, project: Path, command: str) -> None:
    """A command in the session, in the project as the guest has it."""
    Sandbox.connect(name).commands.run(command, cwd=str(project))


def review(client: httpx.Client, name: str) -> dict[str, Any]:
    answer = client.post(f"{V1}/sessions/{name}/reviews")
    assert answer.status_code == 201, answer.text
    found: dict[str, Any] = answer.json()
    return found


def test_one_hunk_of_a_review_lands_and_nothing_else(client: httpx.Client, project: Path) -> None:
    made = make_session(client, project)
    assert made["project"] == str(project) and made["state"] == "running"
    edit("proj-1", project, "printf 'ONE\\ntwo\\nthree\\nfour\\nFIVE\\n' > a.txt; echo new > c.txt; rm b.txt")
    shown = review(client, "proj-1")
    items = {i["path"]: i for i in shown["items"]}
    assert {p: i["kind"] for p, i in items.items()} == {"a.txt": "modified", "b.txt": "deleted", "c.txt": "added"}
    a = items["a.txt"]
    assert [(h["oldLines"], h["newLines"]) for h in a["hunks"]] == [(["one\n"], ["ONE\n"]), (["five\n"], ["FIVE\n"])]
    choice = {"item": a["id"], "digest": a["digest"], "hunks": [a["hunks"][1]["id"]]}
    answer = client.post(f"{V1}/sessions/proj-1/reviews/{shown['id']}/apply", json={"choices": [choice]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"applied": [a["id"]], "refused": [], "left": 2}
    assert (project / "a.txt").read_text() == "one\ntwo\nthree\nfour\nFIVE\n"  # that hunk, and only it
    assert (project / "b.txt").exists() and not (project / "c.txt").exists()
    again = client.get(f"{V1}/sessions/proj-1/reviews/{shown['id']}")
    assert again.json() == shown  # frozen: read back as it was made


def test_an_item_the_guest_changed_after_the_review_is_not_applied(client: httpx.Client, project: Path) -> None:
    make_session(client, project)
    edit("proj-1", project, "echo first > c.txt")
    shown = review(client, "proj-1")
    (c,) = shown["items"]
    edit("proj-1", project, "echo second > c.txt")  # after the review was read
    choice = {"item": c["id"], "digest": c["digest"]}
    answer = client.post(f"{V1}/sessions/proj-1/reviews/{shown['id']}/apply", json={"choices": [choice]})
    assert answer.json()["applied"] == []
    assert answer.json()["refused"] == [{"item": c["id"], "reason": "the guest changed it after the review was read"}]
    assert not (project / "c.txt").exists()


def test_only_what_the_review_showed_can_be_applied(client: httpx.Client, project: Path) -> None:
    make_session(client, project)
    edit("proj-1", project, "echo x > c.txt")
    shown = review(client, "proj-1")
    (c,) = shown["items"]
    apply = f"{V1}/sessions/proj-1/reviews/{shown['id']}/apply"
    wrong = client.post(
        apply, json={"choices": [{"item": c["id"], "digest": "0" * 32}, {"item": "i99", "digest": "0" * 32}]}
    )
    assert [r["reason"] for r in wrong.json()["refused"]] == [
        "not the digest this review showed for it",
        "not in this review",
    ]
    unknown = client.post(f"{V1}/sessions/proj-1/reviews/nosuchreview/apply", json={"choices": []})
    assert unknown.status_code == 404 and "no review" in unknown.json()["message"]
    assert not (project / "c.txt").exists()


def test_holds_are_shown_with_their_reasons(client: httpx.Client, project: Path) -> None:
    make_session(client, project)
    (project / "b.txt").write_text("host edit\n")
    edit("proj-1", project, "echo 'export X=1' > .envrc; echo guest > b.txt")
    items = {i["path"]: i for i in review(client, "proj-1")["items"]}
    assert items[".envrc"]["holds"] == [{"badge": "quarantined", "reason": "a file that runs on the host later"}]
    assert items["b.txt"]["status"] == "conflict"
    assert items["b.txt"]["holds"] == [{"badge": "conflict", "reason": "the host changed it too"}]


def test_checkpoint_rollback_and_fork(client: httpx.Client, project: Path) -> None:
    make_session(client, project)
    taken = client.post(f"{V1}/sessions/proj-1/checkpoints", json={"label": "clean"})
    assert taken.status_code == 201 and taken.json()["snapshotID"] == "proj-1:clean"
    edit("proj-1", project, "echo later > c.txt")
    fork = client.post(f"{V1}/sessions/proj-1/fork", json={"name": "proj-2"})
    assert fork.status_code == 201 and fork.json()["name"] == "proj-2"
    assert [i["path"] for i in review(client, "proj-2")["items"]] == ["c.txt"]  # as proj-1 was, now
    back = client.post(f"{V1}/sessions/proj-1/rollback", json={"label": "clean"})
    assert back.status_code == 200, back.text
    assert review(client, "proj-1")["items"] == []
    assert [c["label"] for c in client.get(f"{V1}/sessions/proj-1/checkpoints").json()] == ["clean"]
    assert sorted(s["name"] for s in client.get(f"{V1}/sessions").json()) == ["proj-1", "proj-2"]


def test_bad_input_is_refused_with_the_fix(client: httpx.Client, project: Path, tmp_path: Path) -> None:
    answer = client.post(f"{V1}/sessions", json={"project": "relative/path"})
    assert answer.status_code == 400 and "absolute" in answer.json()["hint"]
    answer = client.post(f"{V1}/sessions", json={"project": str(tmp_path / "missing")})
    assert answer.status_code == 400 and answer.json()["message"].startswith("no directory")
    answer = client.post(f"{V1}/sessions", json={"project": str(project), "name": "Bad Name"})
    assert answer.status_code == 400 and "lowercase letters" in answer.json()["hint"]
    answer = client.post(f"{V1}/sessions", json={"project": str(project), "colour": "blue"})
    assert answer.status_code == 400 and "colour" in answer.json()["message"]
    answer = client.get(f"{V1}/sessions/UPPER")
    assert answer.status_code == 400 and answer.json()["message"].startswith("not a session name")
    answer = client.get(f"{V1}/sessions/nosuch")
    assert answer.status_code == 404
    answer = client.post(f"{V1}/sessions/nosuch/rollback", content=b"{not json")
    assert answer.status_code == 400 and answer.json()["message"].startswith("the request body is not JSON")
    answer = client.post(f"{V1}/sessions/nosuch/rollback", json={"label": "../x"})
    assert answer.status_code == 400 and "checkpoint label" in answer.json()["message"]
    answer = client.post(f"{V1}/sessions", content=b"[" * (2 * 1024**2))
    assert answer.status_code == 413


def test_a_review_of_many_items_and_lines_comes_in_bounded_pages(
    client: httpx.Client, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many items and lines the guest makes, an answer holds a page: at most `limit` items and
    PAGE_BYTES of lines; an item past ITEM_BYTES is listed without its lines; the pages add up to the review."""
    from vmsandbox.api.plane import extwire

    monkeypatch.setattr(extwire, "PAGE_BYTES", 40_000)
    monkeypatch.setattr(extwire, "ITEM_BYTES", 100_000)
    (project / "big.txt").write_text("x\n")
    (project / "mid.txt").write_text("x\n")
    make_session(client, project)
    edit(
        "proj-1",
        project,
        "mkdir many && for i in $(seq 1 130); do echo $i > many/f$i.txt; done; "
        "python3 -c \"open('big.txt', 'w').write(('y' * 79 + '\\n') * 2000)\"; "
        "python3 -c \"open('mid.txt', 'w').write(('z' * 79 + '\\n') * 400)\"",
    )
    first = review(client, "proj-1")
    assert first["total"] == 132 and len(first["items"]) <= 100 and first["nextToken"] is not None
    seen = list(first["items"])
    token = first["nextToken"]
    while token is not None:
        page = client.get(f"{V1}/sessions/proj-1/reviews/{first['id']}", params={"nextToken": token, "limit": 50})
        assert page.status_code == 200, page.text
        body = page.json()
        assert 1 <= len(body["items"]) <= 50 and body["id"] == first["id"]
        weight = sum(len(line) for i in body["items"] for h in i["hunks"] for line in h["newLines"] + h["oldLines"])
        assert weight <= 40_000 or len(body["items"]) == 1
        seen += body["items"]
        token = body["nextToken"]
    assert len(seen) == 132 and len({i["id"] for i in seen}) == 132
    by_path = {i["path"]: i for i in seen}
    assert not by_path["big.txt"]["hunksShown"] and by_path["big.txt"]["hunks"] == []
    assert by_path["big.txt"]["hunkCount"] >= 1
    assert by_path["mid.txt"]["hunksShown"] and len(by_path["mid.txt"]["hunks"][0]["newLines"]) == 400
    for bad in ("²", "-1", "x", "9" * 40):
        answer = client.get(f"{V1}/sessions/proj-1/reviews/{first['id']}", params={"nextToken": bad})
        assert answer.status_code == 400 and "nextToken" in answer.json()["message"], (bad, answer.text)
