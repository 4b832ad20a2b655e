"""A session's qcow2 overlays: the chain its VM writes (the record's `overlays`, oldest first, above the image or
template disk) and the chains its checkpoints froze. Together they form a tree: a rollback starts a new
branch on a checkpoint's overlay.

The tree is kept small whenever the VM is down (a checkpoint is being taken, a rollback made): an overlay no
checkpoint names and no VM writes is folded into the one overlay above it (`qemu-img rebase`: the image above
reads exactly as before, so no checkpoint changes), and a branch nothing leads to any more is deleted. While
the VM runs only the dead branches go (the VM reads every overlay of its own chain), unless the run of overlays
right below its top is folded into the top by QEMU itself (`streamable`: a live save found the chain deep).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.vm import qemuimg

OVERLAY_GLOB = "overlay*.qcow2"


@dataclass(frozen=True)
class Plan:
    folds: list[tuple[str, str]]  # (overlay, the one above it that takes its content), in order
    dead: list[str]  # overlays in no chain any more


def plan(chains: Sequence[Sequence[str]], named: set[str], present: set[str], *, live: bool) -> Plan:
    """What to fold and delete. `chains` are every chain still needed (the VM's first), `named` the overlays
    that must stay (checkpoints' and the VM's top), `present` every overlay file there is. With `live`, the
    VM's own chain is left alone."""
    working = [list(c) for c in chains]
    folds: list[tuple[str, str]] = []
    while not live:
        above: dict[str, set[str]] = {}
        for c in working:
            for lower, upper in itertools.pairwise(c):
                above.setdefault(lower, set()).add(upper)
        foldable = [o for o, ups in above.items() if o not in named and len(ups) == 1]
        if not foldable:
            break
        overlay = foldable[0]
        folds.append((overlay, next(iter(above[overlay]))))
        working = [[o for o in c if o != overlay] for c in working]
    used = {o for c in chains for o in c}
    return Plan(folds, sorted(present - used))


def streamable(chains: Sequence[Sequence[str]], named: set[str]) -> list[str]:
    """The overlays a running VM may stop reading: the run right below the top of its chain (`chains[0]`, oldest
    first) that no other chain reads and no checkpoint names. QEMU's block stream copies what they hold into the
    top, which then reads the image below them; every other chain reads as before."""
    vm = chains[0]
    kept = named | {o for c in chains[1:] for o in c}
    start = len(vm) - 1
    while start > 0 and vm[start - 1] not in kept:
        start -= 1
    return list(vm[start:-1])


def apply(root: Path, chains: list[list[str]], p: Plan, below: tuple[Path, int] | None = None) -> None:
    """Carry out a plan in the session directory `root`; `chains` (the lists themselves) lose the folded
    overlays. Only while no VM reads the overlays being folded. `below`: the image below every chain and the
    most bytes the session's disk reads as (its record says both): each fold is then told the chain it reads
    (qemuimg.rebase_pinned), never what the overlays' headers say, which the session's QEMU could rewrite;
    None (a session made before the host recorded it): the headers."""
    for overlay, upper in p.folds:
        if below is not None:
            lower = next(c for c in chains if overlay in c)  # any chain through it: the same images below it
            under = [root / o for o in reversed(lower[: lower.index(overlay)])]
            qemuimg.rebase_pinned([root / upper, root / overlay, *under], below[0], below[1], keep=len(under))
        else:
            named = qemuimg.info(root / overlay).backing_file
            if named is None:
                raise ValueError(f"{overlay} has no backing file")
            qemuimg.rebase(root / upper, Path(named) if Path(named).is_absolute() else root / named)
        (root / overlay).unlink()
        for c in chains:
            if overlay in c:
                c.remove(overlay)
    for overlay in p.dead:
        (root / overlay).unlink(missing_ok=True)


def present(root: Path) -> set[str]:
    return {p.name for p in root.glob(OVERLAY_GLOB)}
