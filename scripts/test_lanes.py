# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""`make test`: every lane of the test suite, the lanes side by side, each lane's steps one after another.

The lanes wait far more than they compute (Slurm daemons starting, health-check intervals, sshd, the IdP), so
they share the machine's cores well; each Slurm lab gets its own port block and directory from the lab factory
(tests/support/labs.py), so the two Slurm releases never meet. Each lane writes its output to
out/test-logs/<lane>.log; this script prints a line per finished step, a heartbeat while lanes run, the log tail
of a failed step, and at the end a table of wall time and tests per lane, then the total as the last line.

Usage: .venv/bin/python scripts/test_lanes.py [LANE ...]   (default: every lane; `--list` prints them)
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "out" / "test-logs"
MAKE = [os.environ.get("MAKE", "make"), "--no-print-directory"]
HEARTBEAT = float(os.environ.get("GPUFLEET_LANES_HEARTBEAT", "300"))
# the lab factory's record of who held which port block when (tests/support/labs.py): shown when a Slurm lane fails
BLOCKS_LOG = Path(os.environ.get("GPUFLEET_LAB_ROOT", "/tmp/gpufleet-labs")) / "blocks.log"
TAIL = 300

# lane -> its steps (make targets), run one after another; a failed step ends its lane.
LANES: dict[str, list[str]] = {
    "static": ["lint", "sanity", "ansible-lint", "sanity-221"],
    "unit": ["unit", "unit-221"],
    "services": ["integration-services"],
    "slurm-22.05": ["integration-lab"],
    "slurm-24.11": ["integration-2411"],
}
# what a lane's steps get in their environment: the two Slurm lanes deal the repair scenarios between them (each
# release runs half of them and every other lab test: tests/integration/conftest.py); a lane run alone keeps its
# share, `make integration-lab` by hand runs them all
LANE_ENV: dict[str, dict[str, str]] = {
    "slurm-22.05": {"LAB_SHARE": "1/2"},
    "slurm-24.11": {"LAB_SHARE": "2/2"},
}

COUNT_RE = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
# pytest's closing line, with -q ("3 failed, 90 passed, 2 warnings in 81.20s (0:01:21)") or without ("=== ... ===")
SUMMARY_RE = re.compile(r"^(?:\d+ [a-z]+, )*\d+ [a-z]+ in [0-9.]+s\b|^no tests ran in [0-9.]+s\b")


@dataclass
class Step:
    target: str
    rc: int | None = None
    seconds: float = 0.0
    cpu: float = 0.0  # CPU seconds of the step's processes (daemons they leave running are not counted)
    counts: dict = field(default_factory=dict)


@dataclass
class Lane:
    name: str
    steps: list
    started: float = 0.0
    ended: float | None = None
    log: Path = Path()
    proc: subprocess.Popen | None = None

    @property
    def ok(self) -> bool:
        return all(s.rc == 0 for s in self.steps)


def pytest_counts(text: str) -> dict:
    """The counts of pytest's closing line (``=== 12 passed, 1 skipped in 3.2s ===``), or {} when there is none."""
    for line in reversed(text.splitlines()):
        if SUMMARY_RE.match(line.strip("= \t")):
            counts = {}
            for n, word in COUNT_RE.findall(line):
                word = "errors" if word.startswith("error") else word
                counts[word] = counts.get(word, 0) + int(n)
            return counts
    return {}


LOCK = threading.Lock()
CLK = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat; None where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            ticks = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = sum(ticks[3:5])  # idle + iowait
    total = sum(ticks[:8])  # guest time is already in user
    return total - idle, total


def say(msg: str) -> None:
    with LOCK:
        print(msg, flush=True)


def run_lane(lane: Lane) -> None:
    lane.started = time.monotonic()
    with open(lane.log, "w", encoding="utf-8") as log:
        for step in lane.steps:
            mark = log.tell()
            log.write(f"\n===== make {step.target}\n")
            log.flush()
            t0 = time.monotonic()
            lane.proc = subprocess.Popen(MAKE + [step.target], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **LANE_ENV.get(lane.name, {})})
            _pid, status, usage = os.wait4(lane.proc.pid, 0)
            step.rc = lane.proc.returncode = os.waitstatus_to_exitcode(status)
            step.cpu = usage.ru_utime + usage.ru_stime
            step.seconds = time.monotonic() - t0
            log.flush()
            with open(lane.log, encoding="utf-8", errors="replace") as fh:
                fh.seek(mark)
                text = fh.read()
            step.counts = pytest_counts(text)
            counts = ", ".join(f"{v} {k}" for k, v in step.counts.items())
            status = "passed" if step.rc == 0 else f"FAILED (rc {step.rc})"
            say(f"[{lane.name}] make {step.target}: {status} in {step.seconds / 60:.1f} min"
                + (f" ({counts})" if counts else ""))
            if step.rc != 0:
                tail = text.splitlines()[-TAIL:]
                say(f"----- [{lane.name}] last {len(tail)} lines of make {step.target} (whole log: {lane.log})\n"
                    + "\n".join(tail) + f"\n----- [{lane.name}] end of make {step.target}")
                if lane.name.startswith("slurm") and BLOCKS_LOG.exists():
                    blocks = BLOCKS_LOG.read_text(errors="replace").splitlines()[-120:]
                    say(f"----- the lab factory's last {len(blocks)} block events ({BLOCKS_LOG})\n" + "\n".join(blocks))
                break
    lane.ended = time.monotonic()


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for name, steps in LANES.items():
            print(f"{name}: {' -> '.join(steps)}")
        return 0
    names = argv or list(LANES)
    unknown = [n for n in names if n not in LANES]
    if unknown:
        print(f"test_lanes: unknown lane(s) {unknown}; lanes: {', '.join(LANES)}", file=sys.stderr)
        return 2
    LOGS.mkdir(parents=True, exist_ok=True)
    lanes = [Lane(n, [Step(t) for t in LANES[n]], log=LOGS / f"{n}.log") for n in names]
    threads = [threading.Thread(target=run_lane, args=(lane,), daemon=True) for lane in lanes]

    def stop(signum, _frame):
        for lane in lanes:
            if lane.proc is not None and lane.proc.poll() is None:
                os.killpg(lane.proc.pid, signal.SIGTERM)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    t0 = time.monotonic()
    busy0 = machine_cpu()
    say(f"make test: {len(lanes)} lanes side by side; logs in {LOGS.relative_to(REPO)}/")
    for lane in lanes:
        say(f"[{lane.name}] {' -> '.join(s.target for s in lane.steps)}")
    for t in threads:
        t.start()
    beat = time.monotonic() + HEARTBEAT
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if time.monotonic() >= beat:
            beat += HEARTBEAT
            running = [lane.name for lane in lanes if lane.ended is None]
            say(f"... {(time.monotonic() - t0) / 60:.1f} min: still running: {', '.join(running)}")
    wall = time.monotonic() - t0
    busy1 = machine_cpu()

    say("\nlane          step               status  minutes  CPU min  tests")
    total: dict[str, int] = {}
    for lane in lanes:
        for step in lane.steps:
            status = "-" if step.rc is None else ("ok" if step.rc == 0 else "FAILED")
            counts = ", ".join(f"{v} {k}" for k, v in step.counts.items()) or "-"
            say(f"{lane.name:<13} {step.target:<18} {status:<7} {step.seconds / 60:7.1f}  {step.cpu / 60:7.1f}  "
                f"{counts}")
            for k, v in step.counts.items():
                total[k] = total.get(k, 0) + v
    if busy0 is not None and busy1 is not None and busy1[1] > busy0[1]:
        busy, all_ = busy1[0] - busy0[0], busy1[1] - busy0[1]
        say(f"the machine's CPUs were busy {100 * busy / all_:.0f} % of the time ({busy / CLK / 60:.1f} CPU-minutes "
            f"of {all_ / CLK / 60:.1f}; daemons and everything else on the machine included)")
    say(f"wall time of make test's lanes: {wall / 60:.1f} min")
    failed_steps = sum(1 for lane in lanes for s in lane.steps if s.rc not in (0, None))
    not_run = sum(1 for lane in lanes for s in lane.steps if s.rc is None)
    if failed_steps or not_run:
        say(f"make test: {failed_steps} step(s) failed, {not_run} not run")
    # The closing line: the tests of every pytest step together (a failed non-pytest step counts as one failure).
    failed = total.get("failed", 0) + total.get("errors", 0)
    failed += sum(1 for lane in lanes for s in lane.steps if s.rc not in (0, None) and not s.counts)
    line = f"total: {total.get('passed', 0)} passed, {failed} failed"
    if total.get("skipped"):
        line += f", {total['skipped']} skipped"
    say(line)
    return 0 if all(lane.ok for lane in lanes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
