# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wall time of `gpufleet-health check` on an 8-GPU replay (interpreter start included) and of the brain alone.

Prints figures; asserts nothing. Goal: <= 0.3 s wall for the agent on an 8-GPU replay.
Usage: python benchmarks/bench_health.py [N]   (N runs each, median reported; default 15)
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))
FIX = REPO / "tests" / "fixtures" / "gpu"
XML = FIX / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"
KMSG = FIX / "dmesg-iso-xid13-43-app-fault-storm.log"
AGENT = Path(sys.executable).parent / "gpufleet-health"
GOAL_S = 0.3


def median_ms(fn, n):
    times = []
    for _unused in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times), min(times), max(times)


def main(argv):
    from ansible_collections.gpufleet.reliability.plugins.module_utils import nvml
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import (
        judge,
        read_nvidia_smi_xml,
    )

    n = int(argv[0]) if argv else 15
    xml = XML.read_text()
    kmsg = KMSG.read_text()
    snap = read_nvidia_smi_xml(xml)
    fake = REPO / ".bench-fake-nvml.json"
    fake.write_text("{}")
    rows = []
    try:
        cmd_xml = [str(AGENT), "check", "--nvidia-smi-xml", str(XML), "--kmsg", "-", "--json"]
        cmd_xml_kmsg = [str(AGENT), "check", "--nvidia-smi-xml", str(XML), "--kmsg", str(KMSG), "--json"]
        cmd_fake = [str(AGENT), "check", "--fake-nvml", str(fake), "--kmsg", "-", "--json"]
        env = dict(os.environ)
        for label, cmd in (("agent, 8-GPU XML replay (subprocess, interpreter start included)", cmd_xml),
                           ("agent, 8-GPU XML + 640-line kmsg replay (subprocess)", cmd_xml_kmsg),
                           ("agent, 8-GPU fake NVML via the forked probe (subprocess)", cmd_fake)):
            rows.append((label, *median_ms(lambda c=cmd: subprocess.run(c, env=env, stdout=subprocess.DEVNULL,
                                                                        check=False), n)))
        rows.append(("python -c pass (interpreter start alone)",
                     *median_ms(lambda: subprocess.run([sys.executable, "-c", "pass"], check=False), n)))
        rows.append(("brain: read_nvidia_smi_xml (8 GPUs, 213 KB)", *median_ms(lambda: read_nvidia_smi_xml(xml), n)))
        rows.append(("brain: judge(snapshot) 8 GPUs", *median_ms(lambda: judge(snap, now=1e9), n)))
        rows.append(("brain: judge(snapshot, 640 kmsg lines)", *median_ms(lambda: judge(snap, kmsg, now=1e9), n)))
        rows.append(("brain: judge(None, one Xid 79 line) (simulator call)",
                     *median_ms(lambda: judge(None, ["NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus."],
                                              now=1e9), n)))
        rows.append(("probe: forked fake-NVML probe, 8 GPUs (in process)",
                     *median_ms(lambda: nvml.probe_with_deadline(20, fake_nvml={}), n)))
    finally:
        fake.unlink()
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  median ms     min     max   (N={n})")
    for label, med, lo, hi in rows:
        print(f"{label:<{width}}  {med:9.1f} {lo:7.1f} {hi:7.1f}")
    agent_ms = rows[0][1]
    print(f"goal: agent on an 8-GPU replay <= {GOAL_S * 1000:.0f} ms wall: "
          f"{'met' if agent_ms <= GOAL_S * 1000 else 'NOT met'} ({agent_ms:.0f} ms median)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
