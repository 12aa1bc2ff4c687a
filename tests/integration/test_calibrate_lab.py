# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real records from the lab, read back by ``gpufleet-sim calibrate`` (the site's own records become the scenario).

A lab of this module's own runs with real accounting (MariaDB from Debian's packages and the release's slurmdbd,
started and stopped by the lab script like its other daemons). The test makes a short history: a job that
completes, a job whose node dies (its slurmd killed: Slurm marks the node DOWN "Not responding" and ends the job
NODE_FAIL), the real agent draining a node on a replayed kernel-log capture of Xid 79, and that node's repair
history written into its Extra field through the Slurm adapter as ``repair_step`` writes it (a reset that failed, a
reboot that cured). It then reads Slurm's own records the way a site would (``sacct --json``, ``sacctmgr -P show
event``, the release's node JSON after each history write and ``scontrol -o show node``) and checks that
``calibrate`` counts exactly what the test did, on both Slurm releases.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import History, dumps
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.cli import SlurmClient
from support.labs import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.accounting]
REPO = Path(__file__).resolve().parents[2]
AGENT = Path(sys.executable).parent / "gpufleet-health"
SIM = [sys.executable, "-m", "gpufleet_sim.cli"]
SCENARIO = REPO / "simulator" / "scenarios" / "default-1k.yaml"
#: a real capture (tests/fixtures/gpu/kmsg-xid-line-format-variants.log): a GPU fell off the bus
XID79 = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
EVENT_FORMAT = "format=Cluster,NodeName,TimeStart,TimeEnd,State,Reason,User"


def _until(what: str, check, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


def _kill_job_leftovers(lab) -> None:
    """A job whose slurmd was killed outlives it: its processes (the script, whose command line names the lab's
    spool, and what it started, whose environment names a job of this lab's slurm.conf) stopped by PID."""
    spool = str(lab.dir / "spool")
    conf = f"SLURM_CONF={lab.conf}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if spool in cmd or (conf in env and any(v.startswith(b"SLURM_JOB_ID=") for v in env)):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_calibrate_reads_back_what_the_lab_did(tmp_path):
    with running_lab("the accounting lab (calibrate's round trip)", nodes=3, SLURM_LAB_ACCOUNTING="1",
                     SLURM_LAB_HEALTHCHECK_INTERVAL="0", SLURM_LAB_SLURMD_TIMEOUT="10") as lab:
        try:
            _round_trip(lab, tmp_path)
        finally:
            _kill_job_leftovers(lab)


def _launch_failed(lab, nodes) -> str:
    """Slurm's own word that slurmd could not launch a job on ``nodes`` (slurmstepd gone before it answered)."""
    lines = []
    for node in nodes:
        log = lab.dir / "log" / f"slurmd-{node}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        lines += [f"{node}: {line}" for line in text.splitlines()[-40:] if "launch" in line.lower()]
    stepd = lab.dir / "log" / "slurmstepd.log"  # the step daemons' starts and what they wrote to stderr
    lines += ["slurmstepd.log:"] + (stepd.read_text(errors="replace").splitlines()[-20:] if stepd.exists() else [])
    lines += ["processes naming the lab (pid ppid, signals blocked/ignored, fds, command line):"] + _lab_processes(lab)
    return "\n".join(lines)


def _lab_processes(lab) -> list:
    """Every process whose command line names the lab's directory, with what it inherited (for a failure)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if str(lab.dir) not in cmd:
                continue
            status = dict(line.split(":\t", 1) for line in (proc / "status").read_text().splitlines() if ":\t" in line)
            fds = " ".join(f"{fd.name}->{os.readlink(fd)}"
                           for fd in sorted((proc / "fd").iterdir(), key=lambda f: int(f.name)))
        except OSError:
            continue
        out.append(f"{proc.name} {status.get('PPid', '?')} blk={status.get('SigBlk', '?')} "
                   f"ign={status.get('SigIgn', '?')} fds: {fds} | {cmd[:200]}")
    return out


def _start_jobs(lab, dies: str, quiet: str) -> tuple[str, str, str]:
    """A job that will die with its node and one that completes; the records are read from ``since`` on.

    A failure prints slurmd's launch lines, the step daemons' starts and stderr, and the lab's processes with what
    they inherited (a lab started by a test process that had closed its standard input could launch no job: fixed
    in the lab script, guarded in tests/conftest.py)."""
    time.sleep(2)  # the records from here on: the nodes' cold-start events at the lab's start are before
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
    out = ("--output", "/dev/null")  # not slurm-<id>.out in the directory pytest runs from
    doomed = lab.run("sbatch", "--parsable", "--no-requeue", "-N1", "-w", dies, *out, "--wrap",
                     "sleep 600").stdout.strip()
    done = lab.run("sbatch", "--parsable", "-N1", "-w", quiet, *out, "--wrap", "true").stdout.strip()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if lab.run("squeue", "-h", "-j", doomed, "-o", "%T", check=False).stdout.strip() == "RUNNING":
            return since, doomed, done
        time.sleep(0.5)
    launch = _launch_failed(lab, (dies, quiet)) or "(none)"
    raise AssertionError(f"job {doomed} not running within 60 s; slurmd's launch lines:\n{launch}\n"
                         f"squeue: {lab.run('squeue', check=False).stdout}")


def _round_trip(lab, tmp_path):
    dies, drained, quiet = lab.nodes
    since, doomed, done = _start_jobs(lab, dies, quiet)

    # the real agent drains a node on a replayed Xid 79 (a GPU fell off the bus)
    kmsg = tmp_path / "kmsg.log"
    kmsg.write_text(XID79)
    fake = tmp_path / "healthy.json"
    fake.write_text("{}")
    env = dict(os.environ, **lab.env)
    agent = subprocess.run([str(AGENT), "check", "--slurm", "--json", "--node", drained, "--fake-nvml", str(fake),
                            "--kmsg", str(kmsg), "--expected-gpus", "8", "--state-file", str(tmp_path / "state")],
                           env=env, capture_output=True, text=True, timeout=120, check=False)
    state, reason = lab.wait_for(drained, lambda sr: sr[0] in ("drained", "draining"), timeout=30)
    assert reason.startswith("gpufleet: xid79"), (reason, agent.stdout, agent.stderr)

    # a node dies under its job: slurmd killed, Slurm marks it DOWN and ends the job NODE_FAIL
    os.kill(int((lab.dir / "run" / f"slurmd-{dies}.pid").read_text()), signal.SIGKILL)
    lab.wait_for(dies, lambda sr: sr[0].startswith("down"), timeout=60)

    # Slurm's own records, read as a site reads them
    def sacct_states():
        out = lab.run("sacct", "-X", "-n", "-P", "--format=JobID,State", "-S", since, check=False).stdout
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    states = _until("the jobs' end in sacct", lambda: (s := sacct_states()).get(doomed) == "NODE_FAIL"
                    and s.get(done) == "COMPLETED" and s, 60)
    assert set(states) == {doomed, done}, states

    def events():
        return lab.run("sacctmgr", "-n", "-P", "show", "event", EVENT_FORMAT, f"Start={since}", check=False).stdout

    _until("the DOWN and DRAIN events in sacctmgr", lambda: "Not responding" in events()
           and "gpufleet: xid79" in events(), 60)
    head = "Cluster|NodeName|TimeStart|TimeEnd|State|Reason|User\n"
    (tmp_path / "events.txt").write_text(head + events())
    sacct = lab.run("sacct", "--json", "-S", since).stdout
    json.loads(sacct)  # it is JSON
    (tmp_path / "sacct.json").write_text(sacct)

    jsonl, text_dump = _repair_history_round(lab, drained, tmp_path)
    cal = subprocess.run(SIM + ["calibrate", str(SCENARIO), "--events", str(tmp_path / "events.txt"),
                                "--sacct", str(tmp_path / "sacct.json"), "--nodes", str(jsonl),
                                "--out", str(tmp_path / "site.yaml"), "--json", str(tmp_path / "fit.json")],
                         capture_output=True, text=True, timeout=300, check=False, cwd=REPO / "simulator")
    assert cal.returncode == 0, cal.stdout + cal.stderr
    fit = json.loads((tmp_path / "fit.json").read_text())
    _check_repairs(fit["repairs"], jsonl.read_text(), durations=1)  # the failed reset's proof was in a dump
    text_only = subprocess.run(SIM + ["calibrate", str(SCENARIO), "--nodes", str(text_dump), "--json", "-"],
                               capture_output=True, text=True, timeout=300, check=False, cwd=REPO / "simulator")
    assert text_only.returncode == 0, text_only.stdout + text_only.stderr
    # the last dump alone: the closed incident's steps and class from the history's recent lists, no proof times
    _check_repairs(json.loads(text_only.stdout[text_only.stdout.index("{"):])["repairs"], text_dump.read_text(),
                   durations=0)
    counts = {key: g["count"] for key, g in fit["groups"].items()}
    xid79 = [key for key in counts if key.startswith("xid79")]
    records = (tmp_path / "events.txt").read_text()
    assert xid79 and counts[xid79[0]] == 1, (counts, records)  # the agent's drain, matched to the class by its code
    down = [key for key, g in fit["groups"].items() if "Not responding" in key or key.lower() == "down"]
    # every DOWN the lab recorded, read back: the node that died, once, and any node slurmctld lost for a second
    # while the machine was saturated (a 24.11 lab once recorded the idle node3 DOWN for one second, 04:07:59-:00)
    rows = [line.split("|") for line in records.splitlines()[1:] if line.count("|") == 6]
    lost = [f for f in rows if f[4].upper().startswith("DOWN") and "Not responding" in f[5]]  # DOWN or DOWN*
    assert [f[1] for f in lost].count(dies) == 1, records
    assert down and counts[down[0]] == len(lost), (counts, records)
    assert fit["interruptions"] == 1  # the job that ended NODE_FAIL
    assert not fit["unmatched"], fit["unmatched"]
    site = (tmp_path / "site.yaml").read_text()
    assert "kind: site" in site and "count: 1" in site
    print(cal.stdout)


def _repair_history_round(lab, node: str, tmp_path: Path) -> tuple[Path, Path]:
    """An incident's repair history written on ``node`` as ``repair_step`` writes it (the Slurm adapter's
    ``set_history``, into Extra): a GPU fell off the bus, a reset failed, a reboot cured it. Slurm's node records are
    dumped after each write as a site's cron job would (the adapter's JSON for the release: ``scontrol show node
    --json`` on 23.02 and later, ``sinfo --json`` on 22.05), one a line, and once as ``scontrol -o show node``."""
    client = SlurmClient(env=lab.env, backend="cli")
    now = int(time.time())
    h = History()
    h.open("gpu_lost", "xid79", 0, now - 3600)
    h.start("reset_gpu", now - 3500)
    h.ran(now - 3400)
    h.finish("failed")
    texts = [dumps(h)]
    h.start("reboot", now - 3000)
    texts.append(dumps(h))
    h.settle("ok", now - 2000, cooldown_s=600)
    texts.append(dumps(h))
    lines = []
    for text in texts:
        client.set_history(node, "extra", text)
        lines.append(lab.node_records())
    jsonl = tmp_path / "nodes.jsonl"
    jsonl.write_text("\n".join(lines) + "\n")
    text_dump = tmp_path / "nodes.txt"
    text_dump.write_text(lab.run("scontrol", "-o", "show", "node").stdout)
    return jsonl, text_dump


def _check_repairs(rep: dict, records: str, durations: int) -> None:
    """What calibrate read of the history the test wrote: one incident, its reset failed, its reboot cured it."""
    acts = rep["actions"]
    assert rep["incidents"] == 1 and rep["need"] == {"gpu_lost": "reboot"}, (rep, records[-2000:])
    assert (acts["reset_gpu"]["failed"], acts["reset_gpu"]["cured"]) == (1, 0), (acts, records[-2000:])
    assert (acts["reboot"]["cured"], acts["reboot"]["failed"]) == (1, 0), (acts, records[-2000:])
    assert acts["reset_gpu"]["durations"] == durations and not rep["unreadable"], rep
