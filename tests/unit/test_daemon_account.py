"""The egress daemon off root: the files it holds open (rewritten in place, never renamed), the uid it becomes,
and the handover that gives it its own session's secrets and no others."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.egress import account, control, held, policy, proxylog, secrets
from vmsandbox.egress.held import Held
from vmsandbox.egress.proxylog import Event


def test_a_held_file_sees_every_rewrite_through_the_same_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "egress.json"
    held.rewrite(path, '{"allow": ["a.example"]}')
    kept = Held.open(path)
    try:
        before = kept.version()
        assert json.loads(kept.text()) == {"allow": ["a.example"]}
        inode = path.stat().st_ino
        held.rewrite(path, '{"allow": []}')  # shorter: the rest of the old text is gone too
        assert path.stat().st_ino == inode  # in place: the daemon's descriptor still names the file
        assert kept.text() == '{"allow": []}' and kept.version() != before
        assert held.read(path) == '{"allow": []}'
        assert path.stat().st_mode & 0o777 == 0o600
        assert not kept.removed
        path.unlink()  # its session removed
        assert kept.removed
    finally:
        kept.close()


def test_the_proxy_log_rotates_in_place_so_a_held_writer_keeps_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proxylog, "MAX_LOG_BYTES", 2_000)
    log = tmp_path / "proxy.jsonl"
    writer = proxylog.Writer(log)
    try:
        inode = log.stat().st_ino
        for i in range(40):
            writer.append(Event(method="CONNECT", target=f"host{i}.example:443"))
        proxylog.append(log, Event(decision="policy", reason="a command's own line"))  # opened by path
        writer.append(Event(method="CONNECT", target="last.example:443"))
    finally:
        writer.close()
    assert log.stat().st_ino == inode and log.stat().st_size <= 2_000
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[-1]["target"] == "last.example:443" and lines[-2]["decision"] == "policy"
    older = [json.loads(line) for line in proxylog.rotated(log).read_text().splitlines()]
    assert older  # the previous generation, copied before the log was emptied
    seen = {e.get("target") for e in older + lines}
    assert {f"host{i}.example:443" for i in range(30, 40)} <= seen  # the newest lines are in one or the other
    assert proxylog.rotated(log).stat().st_mode & 0o777 == 0o600


def test_a_uid_is_one_no_account_has_and_no_process_runs_as(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vmsandbox.egress.account.os.geteuid", lambda: 0)
    busy = set(account.UIDS) - {61500}
    assert account.pick(busy) == 61500
    monkeypatch.setattr("vmsandbox.egress.account.os.geteuid", lambda: 1000)
    assert account.pick(set()) is None  # not root: the daemon runs as us, nothing to drop


def test_running_uids_are_read_from_each_process_status(tmp_path: Path) -> None:
    for pid, uids in (("12", "0 0 0 0"), ("345", "61234 61234 61234 61234")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "status").write_text(f"Name:\tx\nUid:\t{uids.replace(' ', chr(9))}\nGid:\t0\n")
    (tmp_path / "self").mkdir()
    assert account.running_uids(tmp_path) == {0, 61234}


def test_become_refuses_a_uid_outside_the_range() -> None:
    with pytest.raises(ValueError, match="not one for an egress daemon"):
        account.become(0)


def test_the_handover_holds_the_sessions_secrets_and_no_others(monkeypatch: pytest.MonkeyPatch) -> None:
    files = paths.session_paths("s1")
    files.root.mkdir(parents=True)
    secrets.put("mapped", "value-1")
    secrets.put("other", "value-2")
    rule = policy.SecretRule("mapped", "api.example.com", "x-api-key", "vmsandbox-placeholder-1")
    absent = policy.SecretRule("not-stored", "b.example.com", "x-api-key", "vmsandbox-placeholder-2")
    policy.write_config(files, {"mode": "allowlist", "allow": [], "secrets": [rule.as_dict(), absent.as_dict()]})
    monkeypatch.setattr("vmsandbox.egress.account.os.geteuid", lambda: 0)
    monkeypatch.setattr(account, "running_uids", set)
    uid, given = account.handed(io.BytesIO(control.handover(files)))
    assert uid in account.UIDS
    assert given == {"mapped": "value-1"}
    assert account.handed(io.BytesIO(b"")) == (None, {})  # started without one (a test's daemon)
    with pytest.raises(ValueError, match="not a JSON object"):
        account.handed(io.BytesIO(b"[1]"))
    with pytest.raises(ValueError, match="not strings"):
        account.handed(io.BytesIO(b'{"secrets": {"a": 1}}'))
    assert files.egress_config.stat().st_mode & 0o777 == 0o600


def test_code_another_account_cannot_read_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """vmsandbox installed under a 0700 home: the daemon would fail at its first lazy import once it dropped
    root, so the place is named (and the daemon stays root, with a warning)."""
    import vmsandbox

    closed = Path(vmsandbox.__file__).parent.parent
    monkeypatch.setattr("vmsandbox.confine.access.may", lambda path, *_a: path != closed)
    assert account.code_readable(61500) == closed
    monkeypatch.setattr("vmsandbox.confine.access.may", lambda *_a: True)
    assert account.code_readable(61500) is None
