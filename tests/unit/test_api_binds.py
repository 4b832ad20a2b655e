"""The API shows what it binds: a review item carries what lands beside its content (its type, its mode, a link's
target), all of which its digest binds; and a held item (quarantined, ignored, binary, a secret, a mass change) is
applied only when the request takes its hold by name, as `--include-risky` does at the terminal — by id and
digest alone it is a 400 that names what to add, and nothing is applied."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.unit.apiserver import point_sdk, served
from vmsandbox.core import views
from vmsandbox.core.sandbox import backend, model
from vmsandbox.core.sandbox.names import Digest, InvalidError, SessionName, Token
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.review import plan
from vmsandbox.sync.review.gather import Gathered, Origin
from vmsandbox.sync.review.threeway import Change, Status
from vmsandbox.sync.target import Target
from vmsandbox.sync.tree.manifest import DIR, FILE, SYMLINK, Entry

V1 = "/vmsandbox/v1"


def _file(data: bytes, mode: int = 0o644) -> Entry:
    return Entry(FILE, mode, len(data), digest=hashlib.sha256(data).hexdigest())


@pytest.fixture
def reviewed(tmp_path: Path) -> plan.Plan:
    """A review of a link, a file made executable and a setuid one, an ignored directory, a binary."""
    files = SessionPaths(tmp_path / "session")
    for d in (files.root, files.baseline, files.guest_tree, tmp_path / "project"):
        d.mkdir(parents=True, exist_ok=True)
    target = Target("s", tmp_path / "project", files, os.getuid(), os.getgid())
    found = [
        Change("link", None, Entry(SYMLINK, 0o777, 8, target="../../x"), None, Status.APPLY),
        Change("run.sh", _file(b"x", 0o644), _file(b"x", 0o755), _file(b"x", 0o644), Status.APPLY,
               risky="a new executable bit"),
        Change("s", None, _file(b"s", 0o4755), None, Status.APPLY),
        Change("d", None, Entry(DIR, 0o755), None, Status.APPLY, ignored="ignored by the project (.gitignore)"),
        Change("b.bin", None, _file(b"\0\1"), None, Status.APPLY, binary=True),
        Change("gone.txt", _file(b"g"), None, _file(b"g"), Status.APPLY),
    ]  # fmt: skip
    made = plan.make(Gathered(target, found, files.guest_tree, True, Origin.LIVE, None, 1024**2, {}))
    made.id = "0" * 32  # (as frozen.freeze names it)
    return made


def test_a_review_item_shows_what_lands_beside_its_content(reviewed: plan.Plan) -> None:
    items = {i.path: i for i in backend._review_of(SessionName("s"), reviewed).items}
    assert (items["link"].entry_type, items["link"].target) == ("symlink", "../../x")
    assert (items["run.sh"].entry_type, items["run.sh"].mode, items["run.sh"].target) == ("file", 0o755, None)
    assert items["s"].mode == 0o755  # (setuid never lands: what is shown is what is written)
    assert (items["gone.txt"].entry_type, items["gone.txt"].mode) == (None, None)
    link = next(i for i in reviewed.todo if i.label == "link")
    other = plan.Item("link", (Change("link", None, Entry(SYMLINK, 0o777, 8, target="elsewhere"), None, Status.APPLY),))
    assert views.fingerprint(link) != views.fingerprint(other)  # (the digest shown binds the target shown)


def test_a_held_item_is_taken_only_by_naming_its_hold(reviewed: plan.Plan) -> None:
    items = backend._review_of(SessionName("s"), reviewed).items
    by_path = {i.path: i for i in items}

    def chose(*paths: str) -> list[model.Choice]:
        return [model.Choice(by_path[p].id, by_path[p].digest) for p in paths]

    model.check_taken(items, chose("link", "s", "gone.txt"), ())  # nothing held among them
    with pytest.raises(InvalidError) as refused:
        model.check_taken(items, chose("run.sh", "d", "b.bin"), ())
    said = refused.value.message + " " + str(refused.value.hint)
    for hold, flag in (("quarantined", "--include-risky"), ("ignored", "--include-ignored"),
                       ("binary", "--include-binary")):  # fmt: skip
        assert f"'{hold}' ({flag} at the terminal)" in said
    assert "run.sh" in said and "a new executable bit" in said
    with pytest.raises(InvalidError, match=r"b\.bin"):
        model.check_taken(items, chose("run.sh", "d", "b.bin"), (model.Badge.QUARANTINED, model.Badge.IGNORED))
    model.check_taken(items, chose("run.sh", "d", "b.bin"), tuple(model.TAKES))


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[httpx.Client]:
    pytest.importorskip("e2b", reason="E2B's SDK is a dev dependency (pip install -e '.[dev]')")
    with served(tmp_path / "guests") as s, httpx.Client(base_url=s.url, headers=s.headers) as c:
        point_sdk(monkeypatch, s)
        yield c


def test_the_api_refuses_a_held_item_chosen_by_id_and_digest_alone(client: httpx.Client, tmp_path: Path) -> None:
    from e2b import Sandbox

    project = tmp_path / "project"
    project.mkdir()
    made = client.post(f"{V1}/sessions", json={"project": str(project), "name": "proj-1"})
    assert made.status_code == 201, made.text
    Sandbox.connect("proj-1").commands.run("echo 'export X=1' > .envrc; chmod 755 .envrc", cwd=str(project))
    shown = client.post(f"{V1}/sessions/proj-1/reviews").json()
    (item,) = shown["items"]
    assert (item["entryType"], item["mode"], item["target"]) == ("file", "0755", None)
    apply = f"{V1}/sessions/proj-1/reviews/{shown['id']}/apply"
    choice = {"item": item["id"], "digest": item["digest"]}
    refused = client.post(apply, json={"choices": [choice]})
    assert refused.status_code == 400, refused.text
    assert "'quarantined' (--include-risky at the terminal)" in refused.json()["hint"]
    assert not (project / ".envrc").exists()
    assert client.post(apply, json={"choices": [choice], "include": ["bogus"]}).status_code == 400
    taken = client.post(apply, json={"choices": [choice], "include": ["quarantined"]})
    assert taken.status_code == 200 and taken.json()["applied"] == [item["id"]], taken.text
    assert (project / ".envrc").read_text() == "export X=1\n"


def test_a_digest_is_a_digest_not_a_take() -> None:
    """(The model's rule reads holds, never the digest: a client that recomputes a digest takes nothing more.)"""
    item = model.ReviewItem(Token("i0"), "p", "added", "apply", Digest("0" * 32),
                            (model.Hold(model.Badge.SECRET, "looks like a key"),))  # fmt: skip
    with pytest.raises(InvalidError, match="a person's own choice"):
        model.check_taken([item], [model.Choice(Token("i0"), Digest("0" * 32))], ())


@pytest.mark.parametrize("spelled", ["i00", "i0000000", "i01", "i", "I0", "i-0", "i0x", "h0", "i12345678"])
def test_an_id_is_taken_only_as_the_review_spelled_it(reviewed: plan.Plan, spelled: str) -> None:
    """(Audit F5: the check of holds matched ids by their text, the apply read them by number, so `i00` took the
    held `i0` with no include.) One parse for both: an id spelled otherwise is a 400, before anything is read."""
    items = backend._review_of(SessionName("s"), reviewed).items
    held = next(i for i in items if i.holds)
    with pytest.raises(InvalidError, match="is not an item of a review"):
        model.check_taken(items, [model.Choice(Token(spelled), held.digest)], ())
    with pytest.raises(InvalidError, match="is not an item of a review"):  # (the session is never looked up)
        backend.SessionBackend.__new__(backend.SessionBackend).apply(
            SessionName("s"), Token("0" * 32), [model.Choice(Token(spelled), held.digest)]
        )
    assert model.number(held.id) == int(held.id.value[1:])  # the ids the review gives are read as given
    assert model.number(Token("h12"), "h") == 12
    with pytest.raises(InvalidError, match="is not a hunk of a review"):
        model.number(Token("h012"), "h")
