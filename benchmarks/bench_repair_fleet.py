# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/repair.yml against the Slurm lab at fleet scale: 32, 64 and 128 nodes (``slurmd -N``), 10 % sick.

Prints, per fleet size, the wall time of one repair run (plan, then every sick node's GPU reset and verification:
no reboot, so no reboot wait), the time until the plan is done and until every step has started, and the Slurm
client calls made (a PATH wrapper around scontrol, sinfo and squeue counts them), split into the plan and the
steps. Asserts nothing. Goal: the controller's cost grows with the sick nodes, not the fleet; a 128-node run plans
and starts its steps in <= 30 s; at most 6 calls that reach slurmctld per sick node (column "RPCs per sick").

The sick nodes are drained by the agent's reason (``gpufleet: xid48 gpu3``) with a report asking for a GPU reset
in the reports directory; the GPU reset goes to a stand-in nvidia-smi and the verification to a stand-in that
prints a healthy report (the GPUs are the only stand-in).

Usage: python benchmarks/bench_repair_fleet.py [SIZES...]   (default 32 64 128)
Environment: SLURM_LAB_PORT_BASE (default 18800; slurmd ports base+101..base+100+N), SLURM_LAB_DIR
(default /tmp/gpufleet-lab-<base>), SLURM_LAB_RELEASE. Runs as root (the lab's daemons); the lab is stopped after.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tests" / "lab" / "slurm-lab.sh"
SICK_SHARE = 0.10
#: Calls that never reach slurmctld (the client's own version check; hostlist arithmetic): counted in "per sick",
#: left out of "RPCs per sick" (the controller's load). Goal: RPCs per sick node <= 6 on the reset path.
LOCAL_CALLS = ("scontrol --version", "scontrol show hostnames", "scontrol show hostlist")
GOAL_S = 30.0
REPORT = {"verdict": "unhealthy", "action": "reset_gpu", "code": "xid48", "gpu": 3, "drain": False,
          "summary": "unhealthy: xid48 on gpu 3 (double-bit ECC error) -> reset_gpu",
          "findings": [{"check": "xid", "severity": "critical", "gpu": 3, "detail": "double-bit ECC error",
                        "evidence": [], "action": "reset_gpu", "code": "xid48", "pci": None, "drain": False}]}
HEALTHY = {"verdict": "healthy", "action": "none", "code": "ok", "gpu": None, "drain": False, "findings": [],
           "summary": "healthy"}


def lab(cmd, env, check=True):
    return subprocess.run(["bash", str(LAB), cmd], env=env, capture_output=True, text=True, check=check)


def lab_env(env):
    out = {}
    for line in lab("env", env).stdout.splitlines():
        if line.startswith("export "):
            key, _sep, value = line[len("export "):].partition("=")
            out[key] = value.replace("$PATH", os.environ.get("PATH", ""))
    return out


def wrappers(d: Path, log: Path, path: str) -> None:
    """scontrol/sinfo/squeue that log each call, then exec the real one."""
    d.mkdir(parents=True, exist_ok=True)
    for tool in ("scontrol", "sinfo", "squeue"):
        real = shutil.which(tool, path=path + ":/usr/sbin:/usr/bin")
        if real is None:
            raise SystemExit(f"{tool} not found: the Slurm clients are needed (make setup)")
        w = d / tool
        w.write_text(f'#!/usr/bin/env bash\necho "$(date +%s.%N) {tool} $*" >>{log}\nexec {real} "$@"\n')
        w.chmod(0o755)


def stand_ins(d: Path) -> tuple:
    smi = d / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\n"
                   "case \"$*\" in\n"
                   "  *--query-compute-apps*) ;;\n"
                   "  *-r*) echo 'GPU 00000000:86:00.0 was successfully reset.'; echo 'All done.' ;;\n"
                   "  *-pm*) echo 'Persistence mode set.' ;;\n"
                   "esac\n")
    smi.chmod(0o755)
    verify = d / "verify"
    verify.write_text(f"#!/usr/bin/env bash\necho '{json.dumps(HEALTHY)}'\n")
    verify.chmod(0o755)
    return smi, verify


def event_time(ev) -> float:
    return datetime.fromisoformat(ev["created"]).timestamp()


def one_run(n: int, base_env: dict) -> dict:
    import ansible_runner

    env = dict(base_env, SLURM_LAB_NODES=str(n), SLURM_LAB_HEALTHCHECK_INTERVAL="0")
    lab("stop", env, check=False)
    t0 = time.monotonic()
    lab("start", env)
    start_s = time.monotonic() - t0
    lenv = lab_env(env)
    slurm_path = lenv.get("PATH", os.environ.get("PATH", ""))
    run_env = dict(os.environ, **lenv)
    nodes = [f"node{i}" for i in range(1, n + 1)]
    sick = nodes[:: int(round(1 / SICK_SHARE))][: max(1, round(n * SICK_SHARE))]
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-repair-{n}-"))
    try:
        reports = tmp / "reports"
        reports.mkdir()
        now = time.time()
        for node in sick:
            (reports / f"{node}.json").write_text(json.dumps(dict(REPORT, node=node, checked_at=now)))
        subprocess.run(["scontrol", "update", f"NodeName={','.join(sick)}", "State=DRAIN",
                        "Reason=gpufleet: xid48 gpu3"], env=run_env, check=True, capture_output=True)
        subprocess.run(["scontrol", "update", f"NodeName={','.join(nodes)}", "Extra="], env=run_env, check=False,
                       capture_output=True)
        calls = tmp / "slurm-calls.log"
        calls.write_text("")
        wrappers(tmp / "bin", calls, slurm_path)
        smi, verify = stand_ins(tmp)
        pdd = tmp / "runner"
        (pdd / "inventory").mkdir(parents=True)
        (pdd / "inventory" / "hosts").write_text("localhost ansible_connection=local\n")
        extravars = {
            "node_repair_config": {"ttl": 0, "cooldown": 0,
                                   "blast_radius": {"max_unavailable": n, "min_healthy": 0},
                                   "breaker": {"min_nodes": n}},
            "node_repair_reports_dir": str(reports),
            "node_repair_state_dir": str(tmp / "state"),
            "node_repair_verify_command": [str(verify), "{node}"],
            "node_repair_dcgm_level": 0,
            "node_repair_nvidia_smi": str(smi),
            "node_repair_throttle": len(sick),
            "node_repair_publish_dir": str(tmp),
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
        }
        envvars = {
            "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "SLURM_CONF": run_env["SLURM_CONF"],
            "PATH": f"{tmp / 'bin'}:{Path(sys.executable).parent}:{slurm_path}:/usr/sbin:/sbin",
        }
        t1 = time.time()
        r = ansible_runner.run(private_data_dir=str(pdd), playbook=str(REPO / "playbooks" / "repair.yml"),
                               extravars=extravars, envvars=envvars, quiet=True, forks=max(5, len(sick)))
        wall = time.time() - t1
        events = list(r.events)
        plays = {ev["event_data"].get("play"): event_time(ev) for ev in events
                 if ev.get("event") == "playbook_on_play_start"}
        step_starts = [event_time(ev) for ev in events if ev.get("event") == "runner_on_start"
                       and ev["event_data"].get("task") == "Reset the GPU"]
        resets = sum(1 for ev in events if ev.get("event") == "runner_on_ok"
                     and ev["event_data"].get("task") == "Reset the GPU")
        plan_done = plays.get("Repair nodes", t1 + wall)
        by_phase = {"plan": Counter(), "steps": Counter()}
        for line in calls.read_text().splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            phase = "plan" if float(parts[0]) < plan_done else "steps"
            words = 3 if parts[1:3] == ["scontrol", "show"] else 2 if parts[1] == "scontrol" else 1
            what = " ".join(parts[1:1 + words])
            by_phase[phase][what] += 1
        return {
            "nodes": n, "sick": len(sick), "status": r.status, "rc": r.rc, "resets": resets,
            "lab_start_s": start_s, "wall_s": wall, "plan_s": plan_done - t1,
            "steps_started_s": (max(step_starts) - t1) if step_starts else None,
            "calls_plan": dict(by_phase["plan"]), "calls_steps": dict(by_phase["steps"]),
        }
    finally:
        lab("stop", env, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv) -> int:
    sizes = [int(a) for a in argv] or [32, 64, 128]
    base = os.environ.get("SLURM_LAB_PORT_BASE", "18800")
    base_env = dict(os.environ, SLURM_LAB_PORT_BASE=base,
                    SLURM_LAB_DIR=os.environ.get("SLURM_LAB_DIR", f"/tmp/gpufleet-lab-{base}"))
    sys.stdout.write(f"repair.yml on the Slurm lab, {SICK_SHARE:.0%} sick (GPU reset + verification each, no "
                     f"reboot); goal: plan + steps started <= {GOAL_S:g} s at 128 nodes\n")
    sys.stdout.write(f"{'nodes':>5} {'sick':>4} {'wall s':>7} {'plan s':>7} {'steps started s':>15} "
                     f"{'calls plan':>10} {'calls steps':>11} {'per sick':>8} {'RPCs per sick':>12}  status\n")
    results = []
    for n in sizes:
        res = one_run(n, base_env)
        results.append(res)
        cp, cs = sum(res["calls_plan"].values()), sum(res["calls_steps"].values())
        rpc = sum(v for k, v in res["calls_steps"].items() if k not in LOCAL_CALLS)
        started = "-" if res["steps_started_s"] is None else f"{res['steps_started_s']:.1f}"
        sys.stdout.write(f"{n:>5} {res['sick']:>4} {res['wall_s']:>7.1f} {res['plan_s']:>7.1f} {started:>15} "
                         f"{cp:>10} {cs:>11} {cs / max(1, res['sick']):>8.1f} {rpc / max(1, res['sick']):>12.1f}  "
                         f"{res['status']} rc={res['rc']} resets={res['resets']}\n")
        sys.stdout.flush()
    for res in results:
        sys.stdout.write(f"{res['nodes']} nodes: plan calls {json.dumps(res['calls_plan'], sort_keys=True)}; "
                         f"step calls {json.dumps(res['calls_steps'], sort_keys=True)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
