# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""`gpufleet-sim sweep --slurm` runs its points as a real Slurm job array on the lab and collects them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.lab


def test_sweep_runs_as_a_job_array_on_the_lab(lab, tmp_path):
    out = tmp_path / "sweep"
    res_json = tmp_path / "sweep.json"
    env = dict(os.environ)
    env.update(lab.env)
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_sim.cli", "sweep", str(REPO / "simulator" / "scenarios" / "rsc1-scaling.yaml"),
         "--param", "jobs[0].nodes", "--values", "64,128,256", "--seeds", "1", "--slurm", "--out", str(out),
         "--json", str(res_json)],
        capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # one array task per point, each wrote its result, and the report names the best point
    script = (out / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-2" in script
    points = sorted(out.glob("point-*.json"))
    assert [p.name for p in points] == ["point-0.json", "point-1.json", "point-2.json"]
    logs = list(out.glob("slurm-*_*.out"))
    assert len(logs) == 3, logs
    res = json.loads(res_json.read_text())
    assert [p["value"] for p in res["points"]] == [64, 128, 256]
    # a smaller synchronous job fails less often: its ETTR is the best
    assert res["best"]["assign"] == {"jobs[0].nodes": 64}
    assert "best: jobs[0].nodes = 64" in proc.stdout
    # the array really ran under Slurm: the log files carry the array job id sbatch returned
    job_id = proc.stdout.split("Slurm array job ", 1)[1].split(":", 1)[0]
    assert job_id.isdigit(), proc.stdout
    assert sorted(p.name for p in logs) == [f"slurm-{job_id}_{i}.out" for i in range(3)]
