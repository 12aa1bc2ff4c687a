# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU stand-in for the repair lab tests: faults are replayed kernel lines from real captures, the GPUs are a
replayed healthy H100 ``nvidia-smi -q -x`` capture, and the verdict comes from the real node agent
(``gpufleet-health check``, its main() run in this process; it drains its own node with ``--slurm``).

    fakegpu.py inject LAB NODE FAULT CLEARED_BY   FAULT: xid48 | xid79; CLEARED_BY: reset_gpu | reboot | never
    fakegpu.py agent LAB NODE        the lab's healthcheck.hook: agent with --slurm, report to $LAB/reports/NODE.json
    fakegpu.py check LAB NODE [AGENT ARGS...]   the agent without --slurm; writes the report and prints it
                                     (verification); exits with the agent's status (0 healthy, 1 degraded,
                                     2 unhealthy, 3 unknown); AGENT ARGS (e.g. --repaired-at T) go to the agent
    fakegpu.py nvidia-smi LAB NODE ARGS...   a fake nvidia-smi for gpu_reset (-r clears reset_gpu faults)

With the file LAB/faults/state-files present, ``agent`` and ``check`` share the node's state file
(LAB/faults/NODE.state.json, under a lock as the gpu_health role's health check takes it), as the role's agent runs:
severe events are remembered between runs.

A reboot (the lab's RebootProgram restarts that node's slurmd) is noticed as a new slurmd PID and clears faults
whose CLEARED_BY is reboot. Like the real agent, ``agent`` drains its own node with a ``gpufleet:`` reason and
never resumes anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FIXTURES = REPO / "tests" / "fixtures" / "gpu"
CAPTURE = FIXTURES / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"
GPU3_PCI = "0000:86:00"  # GPU 3 of that capture


def _verbatim(name):
    """The capture's lines without its header comments."""
    return [ln for ln in (FIXTURES / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def fault_lines(fault: str):
    """Kernel lines for a fault on GPU 3, taken from real captures (PCI address and time prefix rewritten)."""
    if fault == "xid48":
        # gpud's dmesg capture: Xid 48 (DBE) followed by Xid 63 (row remap pending) on one GPU
        lines = [ln for ln in _verbatim("dmesg-iso-xid48-63-94-dbe-rowremap-contained.log")
                 if "Xid" in ln and (": 48," in ln or ": 63," in ln)]
        out = []
        for ln in lines:
            body = ln.split(" ", 1)[1].replace("PCI:0000:19:00", "PCI:" + GPU3_PCI)
            out.append("[ 1843.308145] " + body)
        return out
    if fault == "xid79":
        lines = [ln for ln in _verbatim("kmsg-xid-line-format-variants.log") if ": 79," in ln and "[" in ln]
        return [ln.replace("PCI:0000:05:00", "PCI:" + GPU3_PCI) for ln in lines[:1]]
    raise SystemExit(f"unknown fault {fault!r}")


def _slurmd_pid(lab: Path, node: str) -> int:
    try:
        return int((lab / "run" / f"slurmd-{node}.pid").read_text().strip())
    except (OSError, ValueError):
        return 0


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def fault_path(lab: Path, node: str) -> Path:
    return lab / "faults" / f"{node}.json"


def inject(lab: Path, node: str, fault: str, cleared_by: str) -> None:
    assert cleared_by in ("reset_gpu", "reboot", "never"), cleared_by
    _write_json(fault_path(lab, node), {"fault": fault, "lines": fault_lines(fault), "cleared_by": cleared_by,
                                        "slurmd_pid": _slurmd_pid(lab, node), "at": time.time()})


def current_fault(lab: Path, node: str):
    path = fault_path(lab, node)
    try:
        f = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if f["cleared_by"] == "reboot" and _slurmd_pid(lab, node) not in (0, f["slurmd_pid"]):
        path.unlink(missing_ok=True)  # the node "rebooted": the fault is gone
        return None
    return f


def report(lab: Path, node: str, drain: bool = False) -> dict:
    return _report(lab, node, drain)[0]


def _report(lab: Path, node: str, drain: bool = False, extra=()):
    """Run the real node agent (gpufleet-health check) on the replayed GPUs and the node's fault lines."""
    f = current_fault(lab, node)
    kmsg = "-"
    if f:
        kmsg_path = lab / "faults" / f"{node}.kmsg"
        kmsg_path.write_text("\n".join(f["lines"]) + "\n")
        kmsg = str(kmsg_path)
    argv = ["check", "--nvidia-smi-xml", str(CAPTURE), "--kmsg", kmsg, "--as-of", "now", "--json", "--node", node]
    if drain:
        argv.append("--slurm")
    argv += list(extra)
    os.environ["SLURM_CONF"] = str(lab / "etc" / "slurm.conf")
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin"
    lock = None
    if (lab / "faults" / "state-files").exists():
        argv += ["--state-file", str(lab / "faults" / f"{node}.state.json")]
        lock = open(lab / "faults" / f"{node}.state.lock", "a")  # noqa: SIM115 - held for the agent's run
        fcntl.flock(lock, fcntl.LOCK_EX)
    # the real agent's main(), in this process: one Python start per check instead of two (the lab runs a check on
    # every node every few seconds, and the CPU it takes is CPU the tests do not get)
    from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import health_agent

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = health_agent.main(argv)
    finally:
        if lock is not None:
            lock.close()
    try:
        data = json.loads(out.getvalue())
    except ValueError:
        raise SystemExit(f"gpufleet-health check rc={rc}: {err.getvalue().strip()[:500]}")
    _write_json(lab / "reports" / f"{node}.json", data)
    return data, rc


def agent(lab: Path, node: str) -> int:
    """The lab's healthcheck.hook: the real agent drains its own node when unhealthy (and never resumes)."""
    report(lab, node, drain=True)
    return 0


def nvidia_smi(lab: Path, node: str, args) -> int:
    log = lab / "log" / "fake-nvidia-smi.log"
    with log.open("a") as fh:
        fh.write(f"{time.time():.3f} {node} {' '.join(args)}\n")
    gpu = args[args.index("-i") + 1] if "-i" in args else None
    if any(a.startswith("--query-compute-apps") for a in args):
        procs = lab / "faults" / f"{node}.procs"
        if procs.exists():
            sys.stdout.write(procs.read_text())
        return 0
    if "-r" in args:
        f = current_fault(lab, node)
        if f and f["cleared_by"] == "reset_gpu" and gpu in (None, "3", "00000000:86:00.0", GPU3_PCI):
            fault_path(lab, node).unlink(missing_ok=True)
        sys.stdout.write("GPU 00000000:86:00.0 was successfully reset.\nAll done.\n")
        return 0
    if "-pm" in args:
        sys.stdout.write("Persistence mode set.\n")
        return 0
    sys.stderr.write(f"fake nvidia-smi: unsupported arguments {args}\n")
    return 2


def main(argv) -> int:
    cmd, lab, node = argv[0], Path(argv[1]), argv[2]
    if cmd == "inject":
        inject(lab, node, argv[3], argv[4])
        return 0
    if cmd == "agent":
        return agent(lab, node)
    if cmd == "check":
        data, rc = _report(lab, node, extra=argv[3:])
        sys.stdout.write(json.dumps(data) + "\n")
        return rc
    if cmd == "nvidia-smi":
        return nvidia_smi(lab, node, argv[3:])
    raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
