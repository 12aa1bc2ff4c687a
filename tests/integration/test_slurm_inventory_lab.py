# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpufleet.reliability.slurm inventory plugin against the real lab: its groups must match sinfo."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def plain(value):
    """ansible-inventory marks strings from the source as unsafe: {"__ansible_unsafe": "..."}."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def inventory(path, *extra):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"))
    p = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(path), "--list", *extra], env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    groups = {g: set(v.get("hosts", [])) for g, v in data.items() if g not in ("_meta", "all")}
    return groups, plain(data["_meta"]["hostvars"]), p.stderr


def expected_groups_from_sinfo(lab):
    """What sinfo says, turned into the plugin's group names."""
    want = {}
    out = lab.run("sinfo", "-h", "-N", "-o", "%N|%T|%P|%b|%E").stdout
    for line in out.splitlines():
        name, state, part, feats, reason = line.split("|", 4)
        s = state.rstrip("*~#%$@^")
        groups = {f"slurm_partition_{part.rstrip('*')}"}
        groups.add(f"slurm_state_{s}")
        if s in ("drained", "draining"):
            groups.add("slurm_state_drain")
        if state.endswith("*"):
            groups.add("slurm_state_not_responding")
        if feats not in ("(null)", ""):
            groups |= {f"slurm_feature_{f}" for f in feats.split(",")}
        if s in ("drained", "draining", "down") and reason.startswith("gpufleet:"):
            groups.add("slurm_reason_gpufleet")
        for g in groups:
            want.setdefault(g, set()).add(name)
    return want


def test_groups_match_sinfo(lab, tmp_path):
    n1, n2, n3, n4 = lab.nodes[:4]
    job = lab.run("sbatch", "--parsable", "-w", n2, "-o", "/dev/null", "--wrap", "sleep 60").stdout.strip()
    try:
        lab.wait_for(n2, {"mixed", "allocated"}, timeout=20)
        lab.run("scontrol", "update", f"NodeName={n1}", "State=DRAIN", "Reason=gpufleet: xid79 gpu3")
        lab.run("scontrol", "update", f"NodeName={n2}", "State=DRAIN", "Reason=maintenance by alice")
        lab.run("scontrol", "update", f"NodeName={n3}", "State=DOWN", "Reason=gpufleet: gpu fell off the bus")
        lab.run("scontrol", "update", f"NodeName={n4}", "AvailableFeatures=h100,ib", "ActiveFeatures=h100,ib")
        cfg = tmp_path / "lab.slurm.yml"
        cfg.write_text(f"plugin: gpufleet.reliability.slurm\nslurm_conf: {lab.conf}\n"
                       "compose:\n  ansible_host: slurm_address\n"
                       "keyed_groups:\n  - key: slurm_gres | regex_replace('^gpu:([^:]+):.*$', '\\\\1')\n"
                       "    prefix: gpu_model\n")
        groups, hostvars, _cache = inventory(cfg)
        want = expected_groups_from_sinfo(lab)
        slurm_groups = {g: h for g, h in groups.items() if g.startswith("slurm_") and h}
        assert slurm_groups == want
        assert groups["gpu_model_h100"] == set(lab.nodes)
        assert hostvars[n1]["slurm_reason"] == "gpufleet: xid79 gpu3" and hostvars[n1]["slurm_drained"] is True
        assert hostvars[n2]["slurm_draining"] is True and hostvars[n2]["slurm_sinfo_state"] == "draining"
        assert hostvars[n3]["slurm_state"] == "down" and hostvars[n1]["ansible_host"] == "127.0.0.1"
        assert hostvars[n4]["slurm_features"] == ["h100", "ib"]
        for name, hv in hostvars.items():
            assert hv["slurm_sinfo_state"] == lab.node_states()[name][0]
    finally:
        lab.run("scancel", job, check=False)
        lab.run("scontrol", "update", f"NodeName={n4}", "AvailableFeatures=", "ActiveFeatures=", check=False)


def test_cache_is_used_until_flushed(lab, tmp_path):
    node = lab.nodes[0]
    cfg = tmp_path / "cached.slurm.yml"
    cfg.write_text(f"plugin: gpufleet.reliability.slurm\nslurm_conf: {lab.conf}\ncache: true\n"
                   f"cache_plugin: ansible.builtin.jsonfile\ncache_connection: {tmp_path / 'cache'}\n"
                   "cache_timeout: 3600\n")
    groups, _hostvars, _cache = inventory(cfg)
    assert node in groups["slurm_state_idle"] and "slurm_state_drain" not in groups
    lab.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=gpufleet: cache test")
    groups, _hostvars, _cache = inventory(cfg)
    assert "slurm_state_drain" not in groups, "the cached inventory was not used"
    groups, _hostvars, _cache = inventory(cfg, "--flush-cache")
    assert groups["slurm_state_drain"] == {node} and groups["slurm_reason_gpufleet"] == {node}


def test_node_filter_and_slurmctld_down(lab, tmp_path):
    cfg = tmp_path / "some.slurm.yml"
    cfg.write_text(f"plugin: gpufleet.reliability.slurm\nslurm_conf: {lab.conf}\nnodes: node[2-3]\n")
    _groups, hostvars, _cache = inventory(cfg)
    assert sorted(hostvars) == ["node2", "node3"]
    dead = lab.dir / "etc" / "unreachable-inventory-test.conf"
    dead.write_text(lab.conf.read_text().replace(f"SlurmctldPort={lab.port_base + 17}", "SlurmctldPort=1"))
    cfg.write_text(f"plugin: gpufleet.reliability.slurm\nslurm_conf: {dead}\n")
    try:
        env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"))
        p = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(cfg), "--list"], env=env, capture_output=True,
                           text=True, timeout=120, check=False)
        # the same source under AWX's strict setting: an unparsed source fails the run
        strict = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(cfg), "--list"],
                                env=dict(env, ANSIBLE_INVENTORY_UNPARSED_FAILED="true"), capture_output=True,
                                text=True, timeout=120, check=False)
    finally:
        dead.unlink()
    assert "slurmctld unreachable" in p.stderr
    # the source failed as a whole: no host from it, and a strict run exits non-zero naming the cause
    assert json.loads(p.stdout)["_meta"]["hostvars"] == {}, p.stdout
    assert strict.returncode != 0, strict.stdout + strict.stderr
    assert "slurmctld unreachable" in strict.stderr
