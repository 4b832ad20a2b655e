"""The guest's identity program (images/base/rootfs/usr/local/lib/vmsandbox/identity), run here against a directory
that stands in for the guest's root: the accounts it writes are the rows useradd and groupadd wrote in the image
(read from a real guest), the files are the shell script's, and the warm start's bundle is taken apart as sent."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import os
import socket
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from vmsandbox.guest import identity

PROGRAM = Path(__file__).resolve().parents[2] / "images/base/rootfs/usr/local/lib/vmsandbox/identity"
# /etc of the image, as debootstrap and the recipe leave it (the rows the program reads and extends)
IMAGE_ETC = {
    "passwd": "root:x:0:0:root:/root:/bin/bash\nmessagebus:x:100:105::/nonexistent:/usr/sbin/nologin\n",
    "shadow": "root:*:20000:0:99999:7:::\nmessagebus:!:20000::::::\n",
    "group": "root:x:0:\nsudo:x:27:\nusers:x:100:\nmessagebus:x:105:\ndocker:x:107:\n",
    "gshadow": "root:*::\nsudo:*::\nusers:*::\nmessagebus:!::\ndocker:!::\n",
    "subuid": "",
    "subgid": "",
    "vmsandbox/proxy.env": "http_proxy=http://127.0.0.1:3128\n",
    "ssl/certs/ca-certificates.crt": "-----BEGIN CERTIFICATE-----\nimage\n-----END CERTIFICATE-----\n",
    "skel/.bashrc": "# bashrc\n",
    "skel/.docker/config.json": "{}\n",
}


def load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("vmsandbox_guest_identity", str(PROGRAM))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


ident = load()


class FakeGuest(ident.Guest):  # type: ignore[misc,name-defined]
    """The guest's root in a directory; what touches the running system recorded instead."""

    def __init__(self, root: Path, *, mounted: bool = True) -> None:
        super().__init__(str(root))
        self.hostnames: list[str] = []
        self.owners: dict[str, tuple[int, int]] = {}
        self.mounted = mounted
        self.mounts: list[tuple[str, str]] = []

    def set_hostname(self, name: str) -> None:
        self.hostnames.append(name)

    def is_mount(self, path: str) -> bool:
        return self.mounted

    def is_block(self, dev: str) -> bool:
        return dev == "/dev/sda"

    def mount(self, dev: str, target: str) -> None:
        self.mounts.append((dev, target))

    def chown(self, path: str, uid: int, gid: int) -> None:
        self.owners[os.path.relpath(path, self.root)] = (uid, gid)

    def today(self) -> int:
        return 20792


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    for name, text in IMAGE_ETC.items():
        f = r / "etc" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (r / "etc/shadow").chmod(0o640)
    for d in ("root", "home", "etc/ssh", "etc/sudoers.d", "usr/local/share/ca-certificates"):
        (r / d).mkdir(parents=True, exist_ok=True)
    return r


def source(tmp_path: Path, **entries: str | bytes) -> Any:
    d = tmp_path / "identity"
    d.mkdir()
    for name, value in entries.items():
        (d / name).write_bytes(value.encode() if isinstance(value, str) else value)
    return ident.Source(str(d))


def rows(root: Path, name: str) -> list[str]:
    return (root / "etc" / name).read_text().splitlines()


def test_a_new_user_gets_the_rows_useradd_wrote(root: Path, tmp_path: Path) -> None:
    src = source(tmp_path, user="zed 1234 100\n", authorized_keys="ssh-ed25519 AAAA zed\n")
    g = FakeGuest(root)
    assert ident.user(g, src) == (1234, 100)
    # as `useradd --uid 1234 --gid 100 --groups sudo,docker --create-home --shell /bin/bash zed` wrote them
    assert rows(root, "passwd")[-1] == "zed:x:1234:100::/home/zed:/bin/bash"
    assert rows(root, "shadow")[-1] == "zed:!:20792:0:99999:7:::"
    assert "sudo:x:27:zed" in rows(root, "group") and "docker:x:107:zed" in rows(root, "group")
    assert "sudo:*::zed" in rows(root, "gshadow") and "docker:!::zed" in rows(root, "gshadow")
    assert not any(r.startswith("zed:") for r in rows(root, "group"))  # gid 100 is `users`: no group of its own
    assert rows(root, "subuid") == ["zed:100000:65536"] and rows(root, "subgid") == ["zed:100000:65536"]
    home = root / "home/zed"
    assert (home / ".bashrc").read_text() == "# bashrc\n" and (home / ".docker/config.json").is_file()
    assert oct(home.stat().st_mode & 0o777) == "0o755"
    for entry in ("home/zed", "home/zed/.bashrc", "home/zed/.docker", "home/zed/.docker/config.json"):
        assert g.owners[entry] == (1234, 100)
    assert (home / ".ssh/authorized_keys").read_text() == "ssh-ed25519 AAAA zed\n"
    assert oct((home / ".ssh").stat().st_mode & 0o777) == "0o700"
    assert (root / "root/.ssh/authorized_keys").read_text() == "ssh-ed25519 AAAA zed\n"
    sudoers = root / "etc/sudoers.d/vmsandbox"
    assert sudoers.read_text() == "zed ALL=(ALL:ALL) NOPASSWD: ALL\n" and sudoers.stat().st_mode & 0o777 == 0o440
    assert (root / "etc/shadow").stat().st_mode & 0o777 == 0o640  # the image's mode is kept


def test_a_gid_no_group_has_makes_the_users_group(root: Path, tmp_path: Path) -> None:
    ident.user(FakeGuest(root), source(tmp_path, user="alice 1500 2345\n"))
    assert rows(root, "group")[-1] == "alice:x:2345:" and rows(root, "gshadow")[-1] == "alice:!::"


def test_subordinate_ids_follow_the_last_range(root: Path, tmp_path: Path) -> None:
    (root / "etc/subuid").write_text("bob:100000:65536\n")
    ident.user(FakeGuest(root), source(tmp_path, user="alice 1500 100\n"))
    assert rows(root, "subuid")[-1] == "alice:165536:65536"


def test_an_existing_user_only_joins_the_groups(root: Path, tmp_path: Path) -> None:
    g = FakeGuest(root)
    ident.user(g, source(tmp_path, user="zed 1234 100\n"))
    before = {n: rows(root, n) for n in ("passwd", "shadow", "group", "gshadow")}
    (root / "etc/group").write_text((root / "etc/group").read_text().replace("docker:x:107:zed", "docker:x:107:"))
    (tmp_path / "again").mkdir()
    ident.user(g, source(tmp_path / "again", user="zed 1234 100\n"))  # a reboot applies the identity again
    assert {n: rows(root, n) for n in before} == before  # one row each, and back in docker


def test_a_uid_taken_by_another_account_is_refused(root: Path, tmp_path: Path) -> None:
    with pytest.raises(ident.StepError, match="uid 100 is already messagebus's"):
        ident.user(FakeGuest(root), source(tmp_path, user="zed 100 100\n"))


def test_root_gets_keys_and_no_account(root: Path, tmp_path: Path) -> None:
    before = rows(root, "passwd")
    assert ident.user(FakeGuest(root), source(tmp_path, user="root 0 0\n", authorized_keys="k\n")) == (0, 0)
    assert rows(root, "passwd") == before and (root / "root/.ssh/authorized_keys").read_text() == "k\n"
    assert not (root / "etc/sudoers.d/vmsandbox").exists()


def test_the_whole_identity_as_the_shell_script_wrote_it(root: Path, tmp_path: Path) -> None:
    files = io.BytesIO()
    with tarfile.open(fileobj=files, mode="w") as tar:
        data = b"[user]\n\tname = Zed\n"
        info = tarfile.TarInfo("home/zed/.gitconfig")
        info.size, info.mode, info.uid, info.gid = len(data), 0o644, 1234, 100
        tar.addfile(info, io.BytesIO(data))
    src = source(
        tmp_path,
        hostname="vmsandbox-s1\n",
        user="zed 1234 100\n",
        workdir="/work/my proj\n",
        authorized_keys="key\n",
        host_key="HOSTKEY\n",
        env="A=1\n",
        ca="-----BEGIN CERTIFICATE-----\nsession\n-----END CERTIFICATE-----\n",
        files=files.getvalue(),
    )
    g = FakeGuest(root, mounted=False)
    units = ident.apply(g, src, "/dev/sda")
    assert units == ["vmsandbox-journal@work-my\\x20proj.service"]
    assert g.mounts == [("/dev/sda", str(root / "work/my proj"))] and g.owners["work/my proj"] == (1234, 100)
    assert g.hostnames == ["vmsandbox-s1"] and (root / "etc/hostname").read_text() == "vmsandbox-s1\n"
    assert "127.0.1.1 vmsandbox-s1" in (root / "etc/hosts").read_text()
    key = root / "etc/ssh/ssh_host_ed25519_key"
    assert key.read_text() == "HOSTKEY\n" and key.stat().st_mode & 0o777 == 0o600
    assert (root / "etc/vmsandbox/session.env").read_text() == "A=1\n"
    assert (root / "etc/environment").read_text() == "http_proxy=http://127.0.0.1:3128\nA=1\n"
    bundle = (root / "etc/ssl/certs/ca-certificates.crt").read_text()
    session = "-----BEGIN CERTIFICATE-----\nsession\n-----END CERTIFICATE-----\n"
    assert bundle.endswith(f"image\n-----END CERTIFICATE-----\n{session}\n")
    assert (root / "usr/local/share/ca-certificates/vmsandbox-session.crt").is_file()
    assert (root / "home/zed/.gitconfig").read_text() == "[user]\n\tname = Zed\n"


def test_no_workdir_no_workspace_and_no_journal(root: Path, tmp_path: Path) -> None:
    g = FakeGuest(root, mounted=False)
    assert ident.apply(g, source(tmp_path, user="zed 1234 100\n"), "/dev/sda") == []
    assert g.mounts == []


@pytest.mark.parametrize(
    ("path", "escaped"),
    [
        ("/tmp/wproj", "tmp-wproj"),
        ("/", "-"),
        ("//a//b/./c/", "a-b-c"),
        ("/a b/c-d.e", "a\\x20b-c\\x2dd.e"),
        ("/.hidden/x.y", "\\x2ehidden-x.y"),
        ("/work/ü:_", "work-\\xc3\\xbc:_"),
    ],
)
def test_paths_escape_as_systemd_escape_does(path: str, escaped: str) -> None:
    assert ident.escape_path(path) == escaped


def test_a_path_with_dotdot_starts_no_journal(root: Path, tmp_path: Path) -> None:
    units = ident.apply(FakeGuest(root), source(tmp_path, user="zed 1234 100\n", workdir="/a/../b\n"), "/dev/sda")
    assert units == []


def test_the_warm_bundle_is_unpacked_as_the_host_sent_it(tmp_path: Path) -> None:
    fw = tmp_path / "fw"
    fw.mkdir()
    (fw / "hostname").write_text("s1\n")
    (fw / "template").write_text("1\n")
    (fw / "host_key").write_text("K\n")
    bundle = identity.bundle(fw, now=1234.5, seed=b"\x01" * 64)
    keep = tmp_path / "keep"
    members = ident.unpack(bundle)
    assert members["clock"] == b"1234.500000\n" and members["seed"] == b"\x01" * 64
    assert ident.Source(str(keep), members).line("hostname") == "s1"  # applied from memory
    (keep / "stale").mkdir(parents=True)
    ident.keep(members, str(keep))
    assert sorted(p.name for p in keep.iterdir()) == ["host_key", "hostname"]  # no clock, no seed, no marker
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in keep.iterdir())
    assert keep.stat().st_mode & 0o777 == 0o700


def test_a_bundle_member_outside_its_directory_is_refused(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("../etc/passwd")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ident.StepError, match="unexpected member"):
        ident.unpack(out.getvalue())


def test_the_header_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    payload = b"x" * 10
    os.write(w, b"vmsandbox-identity 10\n" + payload)
    os.close(w)
    marks: list[str] = []
    monkeypatch.setattr(ident, "mark", marks.append)
    assert ident.receive(r) == payload and marks == ["identity arriving"]
    r2, w2 = os.pipe()
    os.write(w2, b"something-else 10\n")
    os.close(w2)
    with pytest.raises(ident.StepError, match="unexpected header"):
        ident.receive(r2)


def test_a_fork_finds_the_workspace_its_source_mounted(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "40 22 8:0 / /work/my\\040proj rw,noatime shared:20 - ext4 /dev/sda rw\n"
        "41 22 0:5 / /work/other rw - tmpfs tmpfs rw\n"
    )
    assert ident.mounted_device("/work/my proj", str(info)) == "/dev/sda"
    assert ident.mounted_device("/work", str(info)) == ""


def _bundle(tmp_path: Path) -> bytes:
    fw = tmp_path / "fw"
    fw.mkdir(exist_ok=True)
    (fw / "hostname").write_text("fork\n")
    return identity.message(fw)


def _port_pair() -> tuple[int, int]:
    """The guest's end of the identity port and the host's."""
    a, b = socket.socketpair()
    return a.detach(), b.detach()


def _answers(end: int) -> bytes:
    got = b""
    while chunk := os.read(end, 4096):
        got += chunk
    return got


def test_a_fork_takes_its_identity_on_the_port_once_the_host_connects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    became: list[dict[str, bytes]] = []
    monkeypatch.setattr(ident, "become_fork", became.append)
    monkeypatch.setattr(ident, "mark", lambda step: None)
    # the port before the host connects: end-of-file at once; `idle` sleeps until it does (here: it connects)
    closed_r, closed_w = os.pipe()
    os.close(closed_w)
    port = os.dup(closed_r)
    guest, host = _port_pair()
    idled: list[int] = []

    def idle() -> None:
        idled.append(1)
        os.dup2(guest, port)  # the host's end connected
        os.write(host, _bundle(tmp_path))

    try:
        assert ident.take_fork(port, idle) is True
        os.close(port)
        os.close(guest)
        assert _answers(host) == b"taking\nok forks\n"
        assert idled == [1] and became[0]["hostname"] == b"fork\n" and "clock" in became[0]
    finally:
        for fd in (closed_r, host):
            os.close(fd)


@pytest.mark.parametrize(
    ("sent", "fails", "answered"),
    [
        (b"something-else 10\n", None, b"error: unexpected header\n"),
        (None, ident.StepError("sshd did not reload"), b"taking\nerror: sshd did not reload\n"),
    ],
)
def test_a_fork_identity_that_fails_is_answered_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sent: bytes | None, fails: Exception | None, answered: bytes
) -> None:
    def become(members: dict[str, bytes]) -> None:
        if fails is not None:
            raise fails

    monkeypatch.setattr(ident, "become_fork", become)
    monkeypatch.setattr(ident, "say", lambda line, err=False: None)
    guest, host = _port_pair()
    os.write(host, sent if sent is not None else _bundle(tmp_path))
    try:
        assert ident.take_fork(guest, lambda: pytest.fail("the host is connected: nothing to wait for")) is False
        os.close(guest)
        assert _answers(host) == answered
    finally:
        os.close(host)


def test_the_reloaded_sshd_is_told_by_its_new_socket(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = "   {n}: {local} 00000000:0000 {st} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0\n"
    table.write_text(
        head
        + row.format(n=0, local="0100007F:0CB8", st="0A", inode=111)  # 127.0.0.1:3256, listening
        + row.format(n=1, local="00000000:0016", st="01", inode=222)  # port 22, an established connection
        + row.format(n=2, local="00000000:0016", st="0A", inode=333)  # sshd's
    )
    assert ident.listening_inode(str(table)) == "333"
    table.write_text(head)
    assert ident.listening_inode(str(table)) is None
    assert ident.listening_inode(str(tmp_path / "none")) is None
