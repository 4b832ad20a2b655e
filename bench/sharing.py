"""Shared-memory benchmark: warm starts that map their template's memory copy-on-write against warm starts that
restore a whole copy of it (`VMSANDBOX_SHARE_MEMORY=0`, the old way), in one run.

Prints, as medians of interleaved runs (these machines are noisy: read the ratios, not the seconds): a bare
qemu-system-x86_64 direct-kernel boot of the same image to its SSH banner, `vmsandbox run -- true` mapped and
copied, and their ratios (issue 48's target: warm <= 0.3x the bare boot). Then two idle kept sessions of each
kind side by side: each QEMU's proportional set size (PSS: the pages it shares with the other counted half;
the guest's RAM apart) and resident set size (RSS), and the host memory the pair takes (their PSS, plus the held
copy of the template's memory when they map it: at most that much), with their ratios (target: PSS <= 100 MiB).
The template is built, and its memory loaded, before anything is timed.

    sudo .venv/bin/python bench/sharing.py [--runs N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from boot import bare_qemu_boot, vmsandbox_run, workdir  # bench/ is on the path: this runs as a script

from vmsandbox import paths
from vmsandbox.image import store as image
from vmsandbox.session.end import lifecycle
from vmsandbox.session.host import images
from vmsandbox.session.options import Options
from vmsandbox.session.place.local import sharing
from vmsandbox.session.record import Record
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create
from vmsandbox.vm import accel

MiB = 1024 * 1024
KINDS = {"mapped": "1", "copied": "0"}  # VMSANDBOX_SHARE_MEMORY for each


def use(kind: str) -> None:
    os.environ[sharing.SWITCH] = KINDS[kind]


def rollup(record: Record, ram_bytes: int) -> tuple[float, float, float]:
    """(PSS, RSS, PSS of the guest's RAM) of the session's QEMU, in MiB: the RAM is its mapping of the guest's
    size with the most resident (libvirt's unused backend, in a mapped session, has the same size and none)."""
    pid = int(Path(f"/run/libvirt/qemu/{record.domain}.pid").read_text())
    found = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        found[key] = int(rest.split()[0]) / 1024
    ram, mapping = 0.0, None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            start, _, end = head[0].partition("-")
            mapping = (int(end, 16) - int(start, 16)) == ram_bytes
        elif mapping and line.startswith("Pss:"):
            ram = max(ram, int(line.split()[1]) / 1024)
    return found["Pss"], found["Rss"], ram


def held_mib(template: str | None) -> float:
    """The memory the held (sealed) copy of the template's RAM takes, once for all its sessions (0: none)."""
    root = paths.memory_holders_dir()
    for entry in root.glob("*.json") if root.is_dir() else ():
        held = json.loads(entry.read_text())
        if held.get("template") == template:
            with contextlib.suppress(OSError):
                return Path(f"/proc/{held['pid']}/fd/{held['fd']}").stat().st_blocks * 512 / MiB
    return 0.0


def idle_pair(work: Path, settings: Settings, kind: str) -> tuple[list[tuple[float, float, float]], float, str]:
    """Two idle kept sessions of one kind: each QEMU's (PSS, RSS), the host memory the pair took, the note."""
    use(kind)
    made: list[Record] = []
    try:
        for i in range(2):
            project = work / f"{kind}{i}"
            project.mkdir(exist_ok=True)
            (project / "README").write_text("idle\n")
            made.append(create.create(Options(project=project, name=None, settings=settings, keep=True)))
        time.sleep(15)  # let both settle
        sizes = [rollup(r, settings.memory_mib * MiB) for r in made]
        records = [Record.load(r.name) for r in made]
        note = f"memory: {records[0].memory or records[0].memory_note}"
        held = held_mib(records[0].template) if records[0].memory else 0.0
        return sizes, sum(size[0] for size in sizes) + held, note
    finally:
        for r in made:
            lifecycle.remove(r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    settings = Settings()
    choice = accel.choose(settings.accel).accel
    img = image.current_image()
    work, project = workdir()
    shape = (project, settings.cpus, settings.memory_mib, choice.value)
    try:
        images.default_template(img)  # built once, before anything is timed
        for kind in KINDS:  # the template's memory loaded for sessions to share (once), the page cache warm
            use(kind)
            vmsandbox_run(*shape, cold=False)
        bare: list[float] = []
        took: dict[str, list[float]] = {k: [] for k in KINDS}
        for i in range(args.runs):
            bare.append(bare_qemu_boot(img, choice, settings.cpus, settings.memory_mib, work))
            for kind in KINDS:
                use(kind)
                took[kind].append(vmsandbox_run(*shape, cold=False)[0])
            print(
                f"run {i + 1}: bare qemu to SSH banner {bare[-1]:.2f}s; run -- true mapped {took['mapped'][-1]:.2f}s, "
                f"copied {took['copied'][-1]:.2f}s",
                file=sys.stderr,
            )
        b, m, c = statistics.median(bare), statistics.median(took["mapped"]), statistics.median(took["copied"])
        idle = {kind: idle_pair(work, settings, kind) for kind in KINDS}
        print(f"accelerator: {choice.value}, {settings.cpus} vCPU, {settings.memory_mib} MiB, image {img.version}")
        print(f"medians of {args.runs} interleaved runs:")
        print(f"  bare qemu-system-x86_64, start to SSH banner:  {b:.2f}s")
        print(f"  vmsandbox run -- true, memory copied (old):    {c:.2f}s  ratio to bare {c / b:.2f}")
        print(
            f"  vmsandbox run -- true, memory mapped:          {m:.2f}s  ratio to bare {m / b:.2f} (target <= 0.30), "
            f"to copied {m / c:.2f}"
        )
        print("two idle sessions of one template, side by side (each QEMU):")
        for kind, (sizes, host, note) in idle.items():
            pss, rss, ram = (statistics.mean(s[i] for s in sizes) for i in range(3))
            print(
                f"  {kind}: PSS {pss:4.0f} MiB (guest RAM {ram:4.0f}, QEMU's own {pss - ram:4.0f}), RSS {rss:4.0f} MiB;"
                f" the pair's PSS and the held copy {host:5.0f} MiB"
            )
            print(f"    ({note})")
        mp, cp = (statistics.mean(s[0] for s in idle[k][0]) for k in ("mapped", "copied"))
        mr, cr = (statistics.mean(s[2] for s in idle[k][0]) for k in ("mapped", "copied"))
        mh, ch = idle["mapped"][1], idle["copied"][1]
        print(
            f"  PSS mapped/copied {mp / cp:.2f} (target: PSS <= 100 MiB), guest RAM's {mr / cr:.2f}; "
            f"pair's memory mapped/copied {mh / ch:.2f}"
        )
    finally:
        os.environ.pop(sharing.SWITCH, None)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
