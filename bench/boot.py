"""Boot benchmark: `vmsandbox run -- true` (start to exit), warm (restored from the image's template) and cold
(`--cold`), against a bare qemu-system-x86_64 direct-kernel boot of the same image (same accelerator, CPU flags,
vCPUs, memory, network) timed to the SSH banner; and the time to the first byte of a command's output, warm and
cold.

Prints the figures side by side, their ratios (targets: warm <= 0.15x bare, cold <= 1.10x bare, first byte
warm <= 0.15x cold, `vmsandbox start` of a stopped session <= 0.15x cold) and the host RSS of one idle
session, warm and cold. Runs are interleaved and the medians compared, because these machines are noisy: read
the ratios, not the seconds. The template is built (once) before anything is timed.

    sudo .venv/bin/python bench/boot.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vmsandbox.egress.ports import free_port
from vmsandbox.guest import ssh
from vmsandbox.image import store as image
from vmsandbox.session.end import lifecycle
from vmsandbox.session.host import images
from vmsandbox.session.options import Options
from vmsandbox.session.record import default_name
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create
from vmsandbox.vm import accel, qemuimg
from vmsandbox.vm.domain import NO_ASLR, TCG_HIDDEN_FLAGS, TCG_TB_CACHE_MIB


def bare_qemu_boot(img: image.Image, choice: accel.Accel, cpus: int, memory_mib: int, work: Path) -> float:
    overlay = work / "bare.qcow2"
    overlay.unlink(missing_ok=True)
    qemuimg.create_overlay(img.disk, overlay)
    host_key = work / "host_key"
    if not host_key.exists():
        ssh.generate_key(host_key, "bench")
    port = free_port()
    accel_arg = "kvm" if choice is accel.Accel.KVM else f"tcg,tb-size={TCG_TB_CACHE_MIB}"
    argv = [
        "qemu-system-x86_64",
        "-machine",
        "q35",
        "-accel",
        accel_arg,
        "-cpu",
        "host"
        if choice is accel.Accel.KVM
        else ",".join(["max", *(f"-{f}" for f in TCG_HIDDEN_FLAGS)]),  # (a session's)
        "-smp",
        str(cpus),
        "-m",
        str(memory_mib),
        "-nodefaults",
        "-display",
        "none",
        "-serial",
        f"file:{work / 'console.log'}",
        "-kernel",
        str(img.kernel),
        "-initrd",
        str(img.initrd),
        "-append",
        img.kernel_cmdline if choice is accel.Accel.KVM else f"{img.kernel_cmdline} {NO_ASLR}",  # as a session's
        "-drive",
        f"file={overlay},if=virtio,format=qcow2",
        "-netdev",
        f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-device",
        "virtio-net-pci,netdev=n0,bus=pcie.0,addr=0x10",
        "-fw_cfg",
        f"name=opt/vmsandbox/host_key,file={host_key}",
    ]
    start = time.monotonic()
    vm = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ssh.wait_for_banner(port, timeout=600, alive=lambda: None if vm.poll() is None else "qemu exited")
        return time.monotonic() - start
    finally:
        vm.kill()
        vm.wait()


def vmsandbox_run(
    project: Path, cpus: int, memory_mib: int, forced: str, *, cold: bool, command: tuple[str, ...] = ("true",)
) -> tuple[float, float]:
    """(start to exit, start to the first byte of the command's output) of one `vmsandbox run`."""
    argv = [
        sys.executable,
        "-m",
        "vmsandbox",
        "run",
        "--cpus",
        str(cpus),
        "--memory",
        f"{memory_mib}M",
        "--accel",
        forced,
        *(["--cold"] if cold else []),
        str(project),
        "--",
        *command,
    ]
    with tempfile.TemporaryFile() as said:
        start = time.monotonic()
        run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=said)
        assert run.stdout is not None
        run.stdout.read(1)
        first = time.monotonic() - start
        run.stdout.read()
        if run.wait() != 0:
            said.seek(0)
            last = said.read().decode(errors="replace").strip().splitlines()[-3:]
            raise SystemExit(f"vmsandbox run failed: {argv}: {' / '.join(last)}")
        took = time.monotonic() - start
    wait_for_teardowns()  # the VM is destroyed in the background: not while the next run is timed
    return took, first


ECHO = ("echo", "x")


def wait_for_teardowns() -> None:
    def running() -> bool:
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        return "vmsandbox.session.end.teardown" in ps

    while running():
        time.sleep(0.2)


def stopped_start(project: Path, settings: Settings) -> float:
    """Seconds `vmsandbox start NAME` takes to resume a stopped (saved) session until its egress is open again,
    as a person runs it (a new process, like `vmsandbox run`)."""
    return resumes(project, settings, 1)[0][0]


def resumes(project: Path, settings: Settings, runs: int) -> list[tuple[float, float]]:
    """For `runs` stops and starts of one kept session: (seconds `vmsandbox start NAME` takes, seconds from its
    start until `vmsandbox exec NAME -- true` has answered), each command a new process as a person runs it (the
    session too is made by `vmsandbox create`: one this process made would be its own, not to stop from elsewhere).
    """
    cli = [sys.executable, "-m", "vmsandbox"]
    name = default_name(project)
    subprocess.run(
        [*cli, "create", "--name", name, "--cpus", str(settings.cpus), "--memory", f"{settings.memory_mib}M", project],
        check=True,
        capture_output=True,
    )
    try:
        found = []
        for _ in range(runs):
            subprocess.run([*cli, "stop", name], check=True, capture_output=True)
            start = time.monotonic()
            subprocess.run([*cli, "start", name], check=True, capture_output=True)
            took = time.monotonic() - start
            subprocess.run([*cli, "exec", name, "--", "true"], check=True, capture_output=True)  # it answers
            found.append((took, time.monotonic() - start))
        return found
    finally:
        subprocess.run([*cli, "rm", name, "--discard"], check=False, capture_output=True)


def idle_rss_mib(project: Path, settings: Settings, *, cold: bool) -> float:
    record = create.create(Options(project=project, name=None, settings=settings, keep=True, cold=cold))
    try:
        time.sleep(10)  # let it settle
        pid = int(Path(f"/run/libvirt/qemu/{record.domain}.pid").read_text())
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")
    finally:
        lifecycle.remove(record)


def workdir() -> tuple[Path, Path]:
    """A scratch directory under /var/tmp (QEMU's user passes through it) with a one-file project in it; the
    sessions' state goes there too unless VMSANDBOX_STATE_DIR says otherwise."""
    work = Path(tempfile.mkdtemp(prefix="vmsandbox-bench-", dir="/var/tmp"))
    work.chmod(0o711)
    project = work / "project"
    project.mkdir()
    (project / "README").write_text("bench\n")
    os.environ.setdefault("VMSANDBOX_STATE_DIR", str(work / "state"))
    return work, project


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    settings = Settings()
    choice = accel.choose(settings.accel).accel
    img = image.current_image()
    work, project = workdir()
    try:
        images.default_template(img)  # built once, before anything is timed
        bare, warm, cold, warm_first, cold_first, resumed = [], [], [], [], [], []
        for i in range(args.runs):
            bare.append(bare_qemu_boot(img, choice, settings.cpus, settings.memory_mib, work))
            shape = (project, settings.cpus, settings.memory_mib, choice.value)
            cold.append(vmsandbox_run(*shape, cold=True)[0])
            warm.append(vmsandbox_run(*shape, cold=False)[0])
            cold_first.append(vmsandbox_run(*shape, cold=True, command=ECHO)[1])
            warm_first.append(vmsandbox_run(*shape, cold=False, command=ECHO)[1])
            resumed.append(stopped_start(project, settings))
            print(
                f"run {i + 1}: bare qemu to SSH banner {bare[-1]:.1f}s; run -- true cold {cold[-1]:.1f}s, "
                f"warm {warm[-1]:.1f}s; first output byte cold {cold_first[-1]:.1f}s, warm {warm_first[-1]:.1f}s; "
                f"start of a stopped session {resumed[-1]:.1f}s",
                file=sys.stderr,
            )
        b, c, w = (statistics.median(x) for x in (bare, cold, warm))
        cf, wf = statistics.median(cold_first), statistics.median(warm_first)
        rss_warm = idle_rss_mib(project, settings, cold=False)
        rss_cold = idle_rss_mib(project, settings, cold=True)
        print(f"accelerator: {choice.value}, {settings.cpus} vCPU, {settings.memory_mib} MiB, image {img.version}")
        print(f"medians of {args.runs} runs:")
        print(f"  bare qemu-system-x86_64, start to SSH banner:  {b:.1f}s")
        print(f"  vmsandbox run -- true, cold (--cold):          {c:.1f}s  ratio to bare {c / b:.2f} (target <= 1.10)")
        print(f"  vmsandbox run -- true, warm:                   {w:.1f}s  ratio to bare {w / b:.2f} (target <= 0.15)")
        print(f"  first byte of the command's output, cold:      {cf:.1f}s")
        print(
            f"  first byte of the command's output, warm:      {wf:.1f}s  ratio to cold {wf / cf:.2f} (target <= 0.15)"
        )
        r = statistics.median(resumed)
        print(f"  vmsandbox start of a stopped session:          {r:.1f}s  ratio to cold {r / c:.2f} (target <= 0.15)")
        print(f"host RSS of one idle session (QEMU): warm {rss_warm:.0f} MiB, cold {rss_cold:.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
