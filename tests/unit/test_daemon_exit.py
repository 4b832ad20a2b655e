"""The egress daemon ends when its session goes, even when it never reached its guest (a `run` killed while the
guest booted, a boot that failed): it never outlives the session it serves."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from vmsandbox import paths
from vmsandbox.egress import control, daemon

URI = "test:///default"  # libvirt's test driver: no domain of that name exists


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # no thread dies of it
def test_the_daemon_ends_when_its_session_goes_before_it_ever_connected() -> None:
    files = paths.session_paths("zz")
    files.root.mkdir(parents=True)
    control.Spec("zz", 1, True, (), URI, "vmsandbox-zz").save(files)
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
