"""Where this account's `vmsandbox serve` keeps what outlives a request: where it runs, the settings E2B's SDK
needs, a key kept across starts, its port, its log (each 0600, in the private state directory)."""

from __future__ import annotations

from pathlib import Path

from vmsandbox import paths


def serve_file() -> Path:
    """Where a running `vmsandbox serve` says it is (its pid and URL, never its key): 0600, in the private state
    directory, so a second one can say where the first is."""
    return paths.state_dir() / "serve.json"


def serve_env_file() -> Path:
    """What E2B's SDK needs to reach the running `vmsandbox serve`, key included (`NAME=value` lines, 0600), for as
    long as it serves: `vmsandbox serve --env` prints it as `export` lines."""
    return paths.state_dir() / "serve.env"


def serve_key_file() -> Path:
    """The API key `vmsandbox serve --keep-key` keeps for its next start (0600); there only while a person asks."""
    return paths.state_dir() / "serve.key"


def serve_port_file() -> Path:
    """The port this account's `vmsandbox serve` listens on, kept after it stops so that the next one takes it back
    (shells still set up for it then reach it, not whoever took the port); locked while a serve runs (flock): no
    settings outlive the serve behind them (0600)."""
    return paths.state_dir() / "serve.port"


def serve_log() -> Path:
    """What a `vmsandbox serve --detach` says on stderr, in the background (never its key)."""
    return paths.state_dir() / "serve.log"
