"""The egress daemon ends when its session goes, even when it never reached its guest (a `run` killed while the
guest booted, a boot that failed): it never outlives the session it serves."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from vmsandbox import paths
from vmsandbox.egress import control, daemon
from vmsandbox.guest import ssh

URI = "test:///default"  # libvirt's test driver: no domain of that name exists


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # no thread dies of it
def test_the_daemon_ends_when_its_session_goes_before_it_ever_connected() -> None:
    files = paths.session_paths("zz")
    files.root.mkdir(parents=True)
    control.Spec("zz", 1, True, (), URI, "vmsandbox-zz").save(files)
    for path in (files.client_key, files.root / "host_key"):  # what the session makes with ssh-keygen
        key = Ed25519PrivateKey.generate()
        path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    ssh.write_known_hosts(files, 1, public)
    served = daemon.Daemon("zz")
    threading.Timer(0.5, shutil.rmtree, args=(files.root,)).start()  # gc removed the session meanwhile

    def give_up() -> None:  # a daemon that would live on: end it, so the assertion below fails (not a hang)
        served.stop.set()
        served.loop.call_soon_threadsafe(served.loop.stop)

    guard = threading.Timer(20, give_up)
    guard.start()
    started = time.monotonic()
    try:
        served.run()  # returns: it does not wait on a guest whose session is gone
    finally:
        guard.cancel()
    assert time.monotonic() - started < 15
    closed: list[bool] = []  # its loop can be closed (or collected) in any thread: no signal handler is left

    def close() -> None:
        served.loop.close()
        closed.append(True)

    closer = threading.Thread(target=close)
    closer.start()
    closer.join()
    assert closed == [True]
