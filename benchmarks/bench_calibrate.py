"""Calibration at scale: a year of a 10,000-node cluster (about a million job records and its node events).

Writes the records once into a temporary directory (``sacct -P``, ``sacct --json`` and ``sacctmgr -P show event``
formats; synthetic, seeded), then times ``calibrate``'s read and fit of each form in a fresh process and prints
the CPU time, the wall time and the process's peak memory (max RSS). Goal: <= 60 s and <= 1 GB. Prints; asserts
nothing.
.venv/bin/python benchmarks/bench_calibrate.py
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES = 10_000
DAYS = 365
JOBS = 1_000_000
EPOCH0 = 1_767_571_200
REASONS = ["gpufleet: xid79 gpu3", "gpufleet: xid48 gpu1", "Not responding", "gpufleet: xid94 gpu2", "ops: dimm"]
SCENARIO = Path(__file__).resolve().parents[1] / "simulator" / "scenarios" / "default-1k.yaml"


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def write_records(d: Path) -> None:
    rnd = random.Random(7)
    span = DAYS * 86400
    with open(d / "events.txt", "w") as fh:
        fh.write("Cluster|NodeName|TimeStart|TimeEnd|State|Reason|User\n")
        for _unused in range(int(NODES * DAYS * 6 / 1000)):
            t = EPOCH0 + rnd.random() * span
            fh.write(f"c|node{rnd.randrange(NODES):05d}|{iso(t)}|{iso(t + rnd.expovariate(1 / 86400))}|DRAIN|"
                     f"{rnd.choice(REASONS)}|root\n")
    runs = []
    for i in range(JOBS):
        start = EPOCH0 + rnd.random() * span
        runs.append((1000 + i, rnd.choice(("COMPLETED", "COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED")),
                     rnd.choice((1, 1, 2, 4, 8, 16, 64)), start, start + rnd.expovariate(1 / 14400)))
    with open(d / "sacct.txt", "w") as fh:
        fh.write("JobID|State|NNodes|Start|End\n")
        for jid, st, n, a, b in runs:
            fh.write(f"{jid}|{st}|{n}|{iso(a)}|{iso(b)}\n")
    with open(d / "sacct.json", "w") as fh:
        fh.write('{"meta": {"plugin": {"type": "openapi/slurmctld"}}, "jobs": [\n')
        for k, (jid, st, n, a, b) in enumerate(runs):
            fh.write(("," if k else "") + json.dumps(
                {"job_id": jid, "name": "train", "state": {"current": [st], "reason": "None"},
                 "allocation_nodes": {"set": True, "infinite": False, "number": n}, "partition": "gpu",
                 "time": {"start": int(a), "end": int(b), "elapsed": int(b - a), "submission": int(a) - 60}}) + "\n")
        fh.write('], "errors": [], "warnings": []}\n')


CHILD = """
import resource, sys, time
from gpufleet_sim import calibrate as cal, scenario as scn
from gpufleet_sim.brain import default_brain
sc = scn.load(sys.argv[1]); sc["cluster"]["nodes"] = 10000
brain = default_brain(sc)
t, c = time.perf_counter(), time.process_time()
events, runs = cal.load_records(sys.argv[2], sys.argv[3])
t0, t1 = cal.window_of(events, runs)
res = cal.fit(sc, brain, events, runs, t0, t1)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{len(runs):,} job runs, {len(events):,} node events: {time.perf_counter() - t:.1f} s wall, "
      f"{time.process_time() - c:.1f} s CPU, max RSS {rss:.0f} MiB, {res['interruptions']:,} interruptions")
"""


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="calib-bench-") as tmp:
        d = Path(tmp)
        t = time.perf_counter()
        write_records(d)
        sizes = ", ".join(f"{p.name} {p.stat().st_size / 2**20:.0f} MiB" for p in sorted(d.iterdir()))
        print(f"a year of a {NODES:,}-node cluster written in {time.perf_counter() - t:.0f} s ({sizes})")
        env = dict(os.environ)
        for form in ("sacct.txt", "sacct.json"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(SCENARIO), str(d / "events.txt"), str(d / form)],
                                 capture_output=True, text=True, env=env, check=False)
            print(f"calibrate with {form}: " + (out.stdout.strip() or out.stderr.strip()[-500:]))


if __name__ == "__main__":
    main()
