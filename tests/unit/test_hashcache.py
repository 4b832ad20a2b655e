"""The hash cache: a rescan reads only what changed, and nothing that changed is ever taken for unchanged."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from vmsandbox.sync.tree import hashcache, manifest
from vmsandbox.sync.tree.hashcache import HashCache


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(hashcache, "RACY_NS", 0)  # the files below are made a moment before the scans
    root = tmp_path / "t"
    (root / "d").mkdir(parents=True)
    for i in range(20):
        (root / "d" / f"f{i}").write_text(f"content {i:04d}\n")
    time.sleep(0.05)
    return root


def scan(root: Path, store: Path) -> tuple[manifest.Manifest, HashCache]:
    cache = HashCache.load(store)
    return manifest.scan(root, cache=cache), cache


def test_a_rescan_reads_nothing_that_did_not_change(files: Path, tmp_path: Path) -> None:
    first, c1 = scan(files, tmp_path / "h.json")
    assert (c1.hits, c1.misses) == (0, 20)
    second, c2 = scan(files, tmp_path / "h.json")
    assert (c2.hits, c2.misses) == (20, 0)
    assert second == first == manifest.scan(files)


def test_a_change_that_keeps_size_and_mtime_is_still_seen(files: Path, tmp_path: Path) -> None:
    first, _ = scan(files, tmp_path / "h.json")
    f = files / "d" / "f3"
    before = f.stat()
    time.sleep(0.05)
    with f.open("r+") as out:  # same inode, same size, and the mtime put back: only the ctime tells
        out.write("CONTENT")
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    second, cache = scan(files, tmp_path / "h.json")
    assert second["d/f3"] == manifest.scan(files)["d/f3"]
    assert second["d/f3"].digest != first["d/f3"].digest
    assert (cache.hits, cache.misses) == (19, 1)


def test_a_replaced_file_is_hashed_again(files: Path, tmp_path: Path) -> None:
    scan(files, tmp_path / "h.json")
    (files / "d" / "new").write_text("content 0005\n")  # what rsync's receiver does: a new inode, renamed
    (files / "d" / "new").replace(files / "d" / "f5")
    second, cache = scan(files, tmp_path / "h.json")
    assert second == manifest.scan(files)
    assert cache.misses == 1


def test_files_changed_just_before_a_scan_are_not_remembered(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    (root / "fresh").write_text("x")
    _, first = scan(root, tmp_path / "h.json")  # RACY_NS as shipped: a file changed 0 s ago is racy
    _, second = scan(root, tmp_path / "h.json")
    assert (first.misses, second.misses, second.hits) == (1, 1, 0)


def test_a_damaged_cache_is_an_empty_one_and_gone_paths_are_forgotten(files: Path, tmp_path: Path) -> None:
    store = tmp_path / "h.json"
    store.write_text("{not json")
    _, cache = scan(files, store)
    assert cache.misses == 20
    (files / "d" / "f0").unlink()
    scan(files, store)
    assert "d/f0" not in json.loads(store.read_text())
    store.write_text(json.dumps({"d/f1": [1, 2, "x"], "d/f2": "nonsense"}))
    _, cache = scan(files, store)
    assert cache.hits == 0
