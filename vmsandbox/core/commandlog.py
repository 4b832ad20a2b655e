"""The log every command keeps: a file in the state directory (rotated), and stderr too with `--verbose`. A module
of its own, apart from settings.py: every command opens it first, before it knows what it runs, and the settings'
models (pydantic, yaml) are for the commands that read them."""

from __future__ import annotations

import logging
import logging.handlers
import threading

from vmsandbox import paths, ui
from vmsandbox.confine import accounts


def open_log(verbose: bool) -> None:
    """Every command's log: a file in the state directory always (rotated), and stderr too when `verbose`. What a
    person was shown already (ui.info, ui.warn) is not said again on stderr."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    threading.excepthook = _thread_failed
    try:
        accounts.state_dirs()
        where = paths.state_dir() / paths.SESSION_LOG
        handler: logging.Handler = logging.handlers.RotatingFileHandler(where, maxBytes=2 * 1024**2, backupCount=2)
        where.chmod(0o600)
        handler.setFormatter(ui.EscapingFormatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    except OSError:
        pass  # a read-only state dir must not stop `--help` or `doctor`
    if verbose:
        stream = logging.StreamHandler()
        stream.setFormatter(ui.EscapingFormatter("%(levelname)s %(name)s: %(message)s"))
        stream.addFilter(lambda record: not getattr(record, "shown", False))
        root.addHandler(stream)


def _thread_failed(args: threading.ExceptHookArgs) -> None:
    """A thread's uncaught exception goes to the log (escaped), not raw to stderr."""
    logging.getLogger("vmsandbox.thread").error(
        "thread %s failed", args.thread.name if args.thread else "?",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
    )  # fmt: skip
