"""Checkpoints, forks and fan-outs without a VM: the overlay tree's folding plan, the XML a checkpoint or a fork
restores, a fork's egress keys, fan-out names and workers' output, comparing sessions' trees."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.unit.test_domain import qemu_args, spec
from vmsandbox import paths, ui
from vmsandbox.egress import policy
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.moments import checkpoint, compare, fanout
from vmsandbox.session.options import Options, Run
from vmsandbox.session.place import chain
from vmsandbox.session.settings import Settings
from vmsandbox.sync.land import outbox
from vmsandbox.sync.review.take import Take
from vmsandbox.sync.tree.manifest import FILE, Entry
from vmsandbox.vm.domain import WORKSPACE_SERIAL, boot_of, build_xml, for_restore, with_disks

# ---------------------------------------------------------------- the overlay tree


def test_an_unnamed_overlay_under_one_other_folds_into_it_in_order() -> None:
    p = chain.plan([["o", "b", "c", "d"]], {"o", "d"}, {"o", "b", "c", "d"}, live=False)
    assert p.folds == [("b", "c"), ("c", "d")]
    assert p.dead == []


def test_a_branch_point_and_named_overlays_stay() -> None:
    # the VM writes on b above o; checkpoint k froze a, also above o: o is where two branches meet
    p = chain.plan([["o", "b"], ["o", "a"]], {"b", "a"}, {"o", "a", "b"}, live=False)
    assert p.folds == []
    assert p.dead == []


def test_what_no_chain_reaches_is_dead_and_a_running_vm_keeps_its_chain() -> None:
    p = chain.plan([["o", "x", "top"]], {"top"}, {"o", "x", "top", "old-branch"}, live=True)
    assert p.folds == []  # o and x are unnamed, but the running VM reads them
    assert p.dead == ["old-branch"]
    down = chain.plan([["o", "x", "top"]], {"top"}, {"o", "x", "top", "old-branch"}, live=False)
    assert down.folds == [("o", "x"), ("x", "top")]
    assert down.dead == ["old-branch"]


def test_a_checkpoint_label_is_a_plain_name() -> None:
    for bad in ("", "../x", "a/b", "-x", "A", "x" * 41, "a b"):
        with pytest.raises(VmsandboxError, match="label"):
            checkpoint._check_label(bad)
    assert checkpoint._check_label("before-refactor.2") == "before-refactor.2"


# ---------------------------------------------------------------- restore XML


def saved_session_xml() -> str:
    s = dataclasses.replace(
        spec(),
        workspace_disk=Path("/state/sessions/s1/workspace.raw"),
        channel=Path("/state/sessions/s1/identity.sock"),
    )
    root = ET.fromstring(build_xml(s))  # noqa: S314
    vda = root.find("devices/disk")
    assert vda is not None
    ET.SubElement(vda, "backingStore", type="file")  # what libvirt writes of the chain it probed
    return ET.tostring(root, encoding="unicode")


def test_a_checkpoint_restores_over_its_new_top_overlay_and_lets_libvirt_probe_the_chain() -> None:
    xml = with_disks(saved_session_xml(), Path("/state/sessions/s1/overlay-1.qcow2"), 41000)
    root = ET.fromstring(xml)  # noqa: S314
    vda, ws = root.findall("devices/disk")
    assert vda.find("source").get("file") == "/state/sessions/s1/overlay-1.qcow2"  # type: ignore[union-attr]
    assert vda.find("backingStore") is None
    assert ws.find("source").get("file") == "/state/sessions/s1/workspace.raw"  # type: ignore[union-attr]
    assert "hostfwd=tcp:127.0.0.1:41000-:22" in qemu_args(xml)[1]


def test_a_fork_restores_with_every_host_path_its_own() -> None:
    d = Path("/state/sessions/s2")
    fork = dataclasses.replace(
        spec(),
        name="vmsandbox-s2",
        session="s2",
        session_dir=d,
        disk=d / "overlay.qcow2",
        console_log=d / "console.log",
        fwcfg_files={"host_key": d / "fwcfg/host_key"},
        workspace_disk=d / "workspace.raw",
        channel=d / "identity.sock",
    )
    xml = for_restore(saved_session_xml(), fork)
    assert "/sessions/s1/" not in xml
    root = ET.fromstring(xml)  # noqa: S314
    ws = [disk for disk in root.findall("devices/disk") if disk.findtext("serial") == WORKSPACE_SERIAL]
    assert ws[0].find("source").get("file") == str(d / "workspace.raw")  # type: ignore[union-attr]
    assert boot_of(xml) == (Path("/img/vmlinuz"), Path("/img/initrd.img"), "root=/dev/vda rw norandmaps")  # as saved


def test_a_fork_on_another_host_says_whose_it_is_and_keeps_the_save_images_layout() -> None:
    import io

    from vmsandbox.session.place.remote import save
    from vmsandbox.vm import savefile
    from vmsandbox.vm.domain import client_of

    there = dataclasses.replace(spec(), name="vmsandbox-s2", session="s2", client="laptop/abc")
    xml = for_restore(saved_session_xml(), there)
    assert client_of(xml) == "laptop/abc"  # its client's gc sweeps it there, no other's
    data = b"<domain/>\0".ljust(64 * 1024, b"\0")
    image = savefile.HEADER.pack(savefile.MAGIC, 2, len(data), 1, 0, 0, b"\0" * 56) + data + b"QEVM"
    saved = savefile.parse(io.BytesIO(image), "t.save")
    head = save.header(saved, xml)
    assert len(head) == saved.stream_offset  # written over a copy's first bytes: the memory stays where it is
    assert savefile.parse(io.BytesIO(head + b"QEVM"), "copy").xml == xml
    with pytest.raises(VmsandboxError, match="does not fit"):
        save.header(saved, xml + " " * 70_000)


def test_a_fork_gets_placeholders_and_a_ca_of_its_own(tmp_path: Path) -> None:
    source = paths.SessionPaths(tmp_path / "src")
    fork = paths.SessionPaths(tmp_path / "fork")
    for f in (source, fork):
        f.fwcfg_dir.mkdir(parents=True)
    old = "vmsandbox-placeholder-" + "0" * 32
    rule = {"secret": "K", "host": "api.example.com", "header": "x-api-key", "placeholder": old, "value": "{secret}"}
    config = {"session": "src", "mode": "allowlist", "allow": ["api.example.com:443"], "secrets": [rule]}
    policy.write_config(source, {**config, "allow_networks": [], "any_network": False, "revoked": False})
    swapped = policy.rekey(source, "fork", fork)
    new = swapped[old]
    assert new != old and new.startswith("vmsandbox-placeholder-")
    written = json.loads(fork.egress_config.read_text())
    assert written["session"] == "fork" and written["secrets"][0]["placeholder"] == new
    assert written["allow"] == ["api.example.com:443"]
    assert fork.ca_key.exists() and (fork.fwcfg_dir / policy.FWCFG_CA).read_bytes() == fork.ca_cert.read_bytes()
    assert json.loads(source.egress_config.read_text())["secrets"][0]["placeholder"] == old  # untouched


# ---------------------------------------------------------------- fan-out


def run_of(name: str | None, project: Path) -> Run:
    return Run(Options(project=project, name=name, settings=Settings()), ["true"], None, False, Take())


def test_fanout_names_its_sessions_after_the_group(tmp_path: Path) -> None:
    assert fanout.names(run_of("exp", tmp_path), 3) == ("exp", ["exp-1", "exp-2", "exp-3"])
    with pytest.raises(VmsandboxError):
        fanout.names(run_of("exp", tmp_path), 0)
    with pytest.raises(VmsandboxError):
        fanout.names(run_of("exp", tmp_path), fanout.MAX_SESSIONS + 1)
    with pytest.raises(VmsandboxError, match="invalid session name"):
        fanout.names(run_of("x" * 30, tmp_path), 12)  # "x…x-12" is longer than a session name may be


def test_quiet_threads_log_their_steps_and_say_a_warning_once(capsys: pytest.CaptureFixture[str]) -> None:
    with ui.quiet("exp-2"):
        ui.info("not shown")
        with ui.step("Booting") as detail:
            detail("kernel")
        ui.warn("using TCG, a unit-test warning")
    with ui.quiet("exp-3"):
        ui.warn("using TCG, a unit-test warning")
    err = capsys.readouterr().err
    assert "not shown" not in err and "Booting" not in err
    assert err.count("using TCG, a unit-test warning") == 1 and "[exp-2]" in err


# ---------------------------------------------------------------- comparing sessions


def entry(digest: str) -> Entry:
    return Entry(FILE, 0o644, 1, digest)


def tree_of(name: str, changed: dict[str, Entry | None], base: dict[str, Entry]) -> compare.Tree:
    return compare.Tree(name, changed, base, Path("/m") / name, Path("/b") / name, "same-baseline")


def test_compare_says_what_each_session_did_and_where_they_agree() -> None:
    base = {"README": entry("r0"), "gone": entry("g0")}
    one = tree_of("a", {"n.txt": entry("1"), "README": entry("r1")}, base)
    two = tree_of("b", {"n.txt": entry("2"), "README": entry("r1"), "gone": None}, base)
    rows = {r.path: r for r in compare.compare([one, two])}
    assert rows["n.txt"].cells == ["added", "added"] and not rows["n.txt"].agree
    assert rows["README"].cells == ["modified", "modified"] and rows["README"].agree
    assert rows["gone"].cells == [compare.UNCHANGED, "deleted"] and not rows["gone"].agree
    assert compare.shared_baseline([one, two])


def test_two_trees_captured_apart_have_no_diff_between_them() -> None:
    one = tree_of("a", {}, {})
    other = dataclasses.replace(tree_of("b", {}, {}), baseline_id="another")
    with pytest.raises(VmsandboxError, match="captured separately"):
        compare.diff_between(one, other)


def test_each_rollback_keeps_its_work_in_a_box_of_its_own(tmp_path: Path) -> None:
    files = paths.SessionPaths(tmp_path / "s")
    first = outbox.fresh_box(files.rolled_back, "c1")
    first.mkdir(parents=True)
    second = outbox.fresh_box(files.rolled_back, "c1")
    assert second != first and second.name.startswith("c1-")
