# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the fuzz campaign: every parser in turn, each in its own child process, then print the table.

Environment: FUZZ_N inputs per parser (default 100000), FUZZ_SEED campaign seed (0), FUZZ_DEADLINE CPU seconds per
input (2), FUZZ_BUDGET_S seconds per parser after which it stops early (0: none), FUZZ_MEM_MIB peak memory one
input may allocate (64), FUZZ_AS_MIB address space a child may add (1024),
FUZZ_ONLY comma-separated parts of parser names to run, FUZZ_OUT folder for the findings (out/fuzz).
Exit status 1 when anything was found. A child that stops making progress (a hang the per-input alarm could not
interrupt) or dies is killed, the input it was on is recorded as a finding, and the run goes on after it.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

# A script, not a test: the harnesses are in tests/support (the unit suite's fuzz smoke uses them too), so tests/
# goes on the path here, as pytest's pythonpath puts it for the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import fuzz_engine as engine  # noqa: E402
from support import fuzz_targets as targets  # noqa: E402


def _child(make, n, start, seed, deadline, mem_mib, as_mib, budget_s, index, conn):
    engine.limit_address_space(as_mib)
    target = make()
    parent = os.getppid()

    def progress(i):
        index.value = i
        if i % 1000 == 0 and os.getppid() != parent:
            os._exit(3)  # the driver is gone: stop

    res = engine.run_target(target, n, seed=seed, deadline_s=deadline, mem_limit_mib=mem_mib, start=start,
                            progress=progress, budget_s=budget_s)
    conn.send(res)
    conn.close()


def run_one(make, n, seed, deadline, mem_mib, as_mib, stall_s, budget_s=0.0):
    """Run ``make()``'s target for n inputs in child processes; returns an engine.Result."""
    ctx = mp.get_context("fork")
    total = engine.Result(make.__name__)
    start, end = 0, n
    while start < end:
        index = ctx.Value("q", start, lock=False)
        parent, child = ctx.Pipe(duplex=False)
        left = max(1.0, budget_s - total.seconds) if budget_s else 0.0
        proc = ctx.Process(target=_child, args=(make, end - start, start, seed, deadline, mem_mib, as_mib, left,
                                                index, child))
        t0 = time.perf_counter()
        proc.start()
        child.close()
        last, last_t, res, stalled = -1, time.monotonic(), None, False
        while True:
            if parent.poll(1.0):
                try:
                    res = parent.recv()
                except EOFError:
                    res = None
                break
            if not proc.is_alive():
                break
            if index.value != last:
                last, last_t = index.value, time.monotonic()
            elif time.monotonic() - last_t > stall_s:
                proc.kill()
                stalled = True
                break
        proc.join(10)
        if res is not None:
            total.target = res.target
            total.inputs += res.inputs
            total.seconds += res.seconds
            total.slowest_ms = max(total.slowest_ms, res.slowest_ms)
            for sig, f in res.findings.items():
                if sig in total.findings:
                    total.findings[sig].count += f.count
                else:
                    total.findings[sig] = f
            break
        # the child died or stalled on input index.value: record it, go on after it
        bad = index.value
        target = make()
        kind = "hang" if stalled else "crash"
        sig = "process stalled (killed)" if stalled else f"process died (exit {proc.exitcode})"
        data = engine.make_input(target, seed, bad)
        total.target = target.name
        total.inputs += bad - start + 1
        total.seconds += time.perf_counter() - t0
        if sig in total.findings:
            total.findings[sig].count += 1
        else:
            total.findings[sig] = engine.Finding(target.name, kind, sig, bad, sig, data)
        start = bad + 1
    return total


def main() -> int:
    n = engine.env_int("FUZZ_N", 100000)
    seed = engine.env_int("FUZZ_SEED", 0)
    deadline = float(os.environ.get("FUZZ_DEADLINE", "2"))
    mem_mib = engine.env_int("FUZZ_MEM_MIB", 64)
    as_mib = engine.env_int("FUZZ_AS_MIB", 1024)
    budget_s = float(os.environ.get("FUZZ_BUDGET_S", "0"))
    only = [s.strip().lower() for s in os.environ.get("FUZZ_ONLY", "").split(",") if s.strip()]
    out = Path(os.environ.get("FUZZ_OUT", str(engine.REPO / "out" / "fuzz")))
    out.mkdir(parents=True, exist_ok=True)
    rows, summary = [], []
    for make in targets.ALL:
        if only and not any(o in make.__name__.lower() for o in only):
            continue
        engine.stderr(f"fuzz: {make.__name__} ({n} inputs, seed {seed})")
        res = run_one(make, n, seed, deadline, mem_mib, as_mib, stall_s=max(120.0, 30 * deadline),
                      budget_s=budget_s)
        rows.append(res)
        engine.stderr(f"  {res.target}: {res.inputs} inputs, {res.seconds:.1f} s, {len(res.findings)} findings")
        for f in res.findings.values():
            fid = engine.finding_id(f)
            path = out / f"{fid}.bin"
            path.write_bytes(f.data)
            summary.append({"parser": f.target, "kind": f.kind, "signature": f.signature, "error": f.error,
                            "where": f.where, "first_index": f.index, "count": f.count, "input": path.name,
                            "input_repr": repr(f.data[:300])})
            engine.stderr(f"  finding {fid}: {f.kind} {f.error} at {f.where or '?'}; minimal input {f.data[:160]!r}")
    (out / "summary.json").write_text(json.dumps({"seed": seed, "inputs_per_parser": n, "findings": summary,
                                                  "parsers": [{"parser": r.target, "inputs": r.inputs,
                                                               "seconds": round(r.seconds, 1),
                                                               "slowest_ms": round(r.slowest_ms, 1),
                                                               "findings": len(r.findings)} for r in rows]},
                                                 indent=1) + "\n", encoding="utf-8")
    width = max([len(r.target) for r in rows] + [6])
    lines = [f"{'parser':<{width}}  {'inputs':>8}  {'seconds':>8}  {'slowest ms':>10}  findings",
             f"{'-' * width}  {'-' * 8}  {'-' * 8}  {'-' * 10}  --------"]
    for r in rows:
        lines.append(f"{r.target:<{width}}  {r.inputs:>8}  {r.seconds:>8.1f}  {r.slowest_ms:>10.1f}  {len(r.findings)}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if any(r.findings for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
