# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-host cost of a no-op gpufleet.reliability.slurm_node task versus ansible.builtin.ping.

64 inventory hosts, all ``ansible_connection=local``, each pointing at one of the lab's Slurm nodes
(host i -> node (i mod N) + 1). The slurm_node task is ``state: resumed`` on idle nodes: it reads Slurm and
changes nothing. Per-host cost = (wall(64 hosts) - wall(1 host)) / 63, so ansible-playbook's fixed start-up
cost drops out. Also printed: the batched form (one task, run_once, ``name: node[1-N]``) that playbooks should
use. Uses the Slurm lab (tests/lab/slurm-lab.sh; started here if it is not running, stopped again after).

    .venv/bin/python benchmarks/bench_slurm_node.py [--hosts 64] [--repeat 1] [--forks 10]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tests" / "lab" / "slurm-lab.sh"
BIN = Path(sys.executable).parent


def lab_env():
    out = subprocess.run(["bash", str(LAB), "env"], capture_output=True, text=True, check=True).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _sep, v = line[7:].partition("=")
            env[k] = v.replace("$PATH", os.environ["PATH"])
    return env


def write_inventory(path, hosts, nodes):
    lines = ["[bench]"]
    for i in range(hosts):
        lines.append(f"h{i:03d} slurm_node_name=node{(i % nodes) + 1}")
    lines += ["", "[bench:vars]", "ansible_connection=local", f"ansible_python_interpreter={sys.executable}"]
    path.write_text("\n".join(lines) + "\n")


PLAYS = {
    "ping": """
- hosts: bench
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
""",
    "slurm_node": """
- hosts: bench
  gather_facts: false
  tasks:
    - name: No-op resume of the host's Slurm node
      gpufleet.reliability.slurm_node:
        name: "{{ slurm_node_name }}"
        state: resumed
        backend: cli
      register: r
      failed_when: r is failed or r is changed
""",
    "slurm_node_batched": """
- hosts: bench
  gather_facts: false
  tasks:
    - name: One batched no-op resume for every node
      gpufleet.reliability.slurm_node:
        name: "node[1-{nodes}]"
        state: resumed
        backend: cli
      run_once: true
      register: r
      failed_when: r is failed or r is changed
""",
}


def run_play(workdir, play, hosts, nodes, forks, env):
    inv = workdir / f"inv-{hosts}.ini"
    write_inventory(inv, hosts, nodes)
    pb = workdir / f"{play}.yml"
    pb.write_text(PLAYS[play].replace("{nodes}", str(nodes)))
    t0 = time.perf_counter()
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(pb), "-f", str(forks)],
                       env=env, capture_output=True, text=True, cwd=REPO, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"{play} with {hosts} hosts failed (rc={p.returncode})")
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement; the median is used")
    ap.add_argument("--forks", type=int, default=10)
    args = ap.parse_args()

    nodes = int(os.environ.get("SLURM_LAB_NODES", "4"))
    was_running = subprocess.run(["bash", str(LAB), "status"], capture_output=True, check=False).returncode == 0
    subprocess.run(["bash", str(LAB), "start"], check=True, capture_output=True)
    try:
        env = dict(os.environ)
        env.update(lab_env())
        env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
        env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                   ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_DEPRECATION_WARNINGS="False")
        # resume anything a previous run left drained, so that the slurm_node task is a no-op
        subprocess.run(["scontrol", "update", f"NodeName=node[1-{nodes}]", "State=RESUME"], env=env,
                       capture_output=True, check=False)
        subprocess.run(["bash", str(LAB), "wait"], check=True, capture_output=True)
        time.sleep(2)  # 'idle*' right after RESUME would make the no-op task see a transient state
        with tempfile.TemporaryDirectory(prefix="bench-slurm-node-") as tmp:
            work = Path(tmp)
            res = {}
            for play in ("ping", "slurm_node"):
                for n in (1, args.hosts):
                    res[(play, n)] = statistics.median(
                        run_play(work, play, n, nodes, args.forks, env) for _rep in range(args.repeat))
            batched = statistics.median(
                run_play(work, "slurm_node_batched", args.hosts, nodes, args.forks, env) for _rep in range(args.repeat))
    finally:
        if not was_running:
            subprocess.run(["bash", str(LAB), "stop"], capture_output=True, check=False)

    h = args.hosts
    per = {play: (res[(play, h)] - res[(play, 1)]) / (h - 1) for play in ("ping", "slurm_node")}
    print(f"bench_slurm_node: {h} hosts, connection=local, forks={args.forks}, median of {args.repeat}, "
          f"{os.cpu_count()} CPUs, Slurm lab {nodes} nodes")
    print(f"{'task':<28}{'wall 1 host (s)':>17}{f'wall {h} hosts (s)':>19}{'per host (s)':>15}")
    for play in ("ping", "slurm_node"):
        print(f"{play:<28}{res[(play, 1)]:>17.2f}{res[(play, h)]:>19.2f}{per[play]:>15.3f}")
    print(f"{'slurm_node batched (1 task)':<28}{'':>17}{batched:>19.2f}{batched / h:>15.3f}")
    print(f"ratio slurm_node / ping per host: {per['slurm_node'] / per['ping']:.2f}")
    print(f"batched slurm_node for {h} hosts vs per-host slurm_node: "
          f"{res[('slurm_node', h)] / batched:.1f}x less wall time")


if __name__ == "__main__":
    main()
