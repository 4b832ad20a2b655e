"""What `--yes` takes beyond the safe, reviewable changes, for files and commits alike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Take:
    """What `--yes` takes beyond the safe, reviewable changes: quarantined ones (--include-risky), ones the
    project ignores (--include-ignored), binary files (--include-binary), a mass change (--include-mass); for
    the guest's commits, what their paths may be."""

    risky: bool = False
    ignored: bool = False
    binary: bool = False
    mass: bool = False  # a mass change (mass.py) too
