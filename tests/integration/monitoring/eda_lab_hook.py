"""The Slurm lab's health hook for the loop test: the real node agent on the repair lab's replayed GPUs and
injected faults (tests/support/fakegpu.py), with --slurm (drains its own node), --report-file (what the
repair plan reads) and --textfile (what node_exporter serves). Logs each drain it makes with the time.

    eda_lab_hook.py LAB TEXTFILE_ROOT      (SLURMD_NODENAME names the node, as slurmd sets it)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# slurmd runs this file as a script (the hook test_loop_lab.py writes), not pytest: tests/ goes on the path here
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import fakegpu  # noqa: E402 - the repair lab's GPU stand-in


def main(lab: Path, textfile_root: Path) -> int:
    node = os.environ.get("SLURMD_NODENAME", "unknown")
    fault = fakegpu.current_fault(lab, node)
    kmsg = "-"
    if fault:
        path = lab / "faults" / f"{node}.loop.kmsg"
        path.write_text("\n".join(fault["lines"]) + "\n")
        kmsg = str(path)
    argv = [str(Path(sys.executable).parent / "gpufleet-health"), "check", "--nvidia-smi-xml", str(fakegpu.CAPTURE),
            "--kmsg", kmsg, "--as-of", "now", "--json", "--node", node, "--slurm",
            "--report-file", str(lab / "reports" / f"{node}.json"), "--textfile", str(textfile_root / node)]
    env = dict(os.environ, SLURM_CONF=str(lab / "etc" / "slurm.conf"))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    data = json.loads(proc.stdout)
    if (data.get("slurm") or {}).get("action") == "drained":
        with open(textfile_root / "drains.log", "a", encoding="utf-8") as fh:
            fh.write(f"{time.time():.3f} {node} {data.get('code')}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2])))
