"""The filter gpufleet.reliability.repair_prometheus in a real ansible-playbook run: a repair plan, breaker and
step results become the repair run's textfile, accepted by promtool, with the series the alert rules read."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, need

PLAYBOOK = """
- name: Repair metrics
  hosts: localhost
  gather_facts: false
  vars:
    plan: {decisions: [{node: gpu1, action: reboot, needs_approval: true, approved: false},
                       {node: gpu2, action: escalate}]}
    breaker: {tripped: true}
    results: [{node: gpu3, action: reset_gpu, failed: true}]
  tasks:
    - name: Write the repair metrics
      ansible.builtin.copy:
        content: "{{ plan | gpufleet.reliability.repair_prometheus(breaker, results, 1800000000) }}"
        dest: "{{ out }}"
        mode: "0644"
"""


def test_filter_writes_the_repair_textfile(tmp_path):
    pb = tmp_path / "pb.yml"
    pb.write_text(PLAYBOOK)
    out = tmp_path / "gpufleet_repair.prom"
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    p = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        "-e", json.dumps({"out": str(out), "ansible_python_interpreter": sys.executable}), str(pb)],
                       capture_output=True, text=True, check=False, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    text = out.read_text()
    check = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stderr
    assert "gpufleet_repair_breaker_open 1\n" in text
    assert 'gpufleet_repair_pending_approval{node="gpu1",action="reboot"} 1\n' in text
    assert 'gpufleet_repair_escalated{node="gpu2"} 1\n' in text
    assert 'gpufleet_repair_step_failed{node="gpu3",action="reset_gpu"} 1\n' in text
    assert "gpufleet_repair_last_run_timestamp_seconds 1800000000.0\n" in text
