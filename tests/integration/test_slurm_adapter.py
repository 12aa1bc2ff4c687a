# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""SlurmClient (cli backend) against the real lab daemons."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import SlurmClient, SlurmError

pytestmark = pytest.mark.lab


@pytest.fixture
def client(lab):
    return SlurmClient(backend="cli")


def test_reads_every_node_as_sinfo_does(lab, client):
    assert client.version().startswith(lab.release)
    nodes = client.nodes()
    assert sorted(nodes) == sorted(lab.nodes)
    for name, (state, _reason) in lab.node_states().items():
        assert nodes[name].sinfo_state == state
        assert nodes[name].gres == "gpu:h100:8" and nodes[name].partitions == ["gpu"]


def test_drain_resume_down_cycle_matches_sinfo(lab, client):
    a, b = lab.nodes[0], lab.nodes[1]
    assert client.drain(f"{a},{b}", "gpufleet: xid79 gpu3") == [a, b]
    states = lab.node_states()
    assert states[a] == states[b] == ("drained", "gpufleet: xid79 gpu3")
    node = client.node(a)
    assert node.drained and node.reason_user == "root" and node.reason_time
    # DOWN on a drained node keeps DRAIN: sinfo still says "drained"
    assert client.down(b, "gpu fell off the bus") == [b]
    assert client.node(b).is_down and client.node(b).sinfo_state == lab.node_states()[b][0] == "drained"
    c = lab.nodes[2]
    client.down(c, "gpu fell off the bus")
    assert client.node(c).is_down and lab.node_states()[c][0].startswith("down")
    assert client.node(c).sinfo_state == lab.node_states()[c][0]
    assert sorted(client.resume(lab.nodes)) == sorted([a, b, c])
    for n in (a, b, c):
        lab.wait_for(n, "idle", timeout=15)
    assert client.resume(lab.nodes) == []


def test_unknown_node_is_refused_and_nothing_changes(lab, client):
    with pytest.raises(SlurmError) as e:
        client.drain(f"{lab.nodes[0]},nosuchnode7", "x")
    assert e.value.kind == "unknown_node" and "nosuchnode7" in str(e.value)
    assert lab.node_states()[lab.nodes[0]][0] == "idle"  # 24.11 keeps an old reason on idle nodes
    assert "DRAIN" not in client.node(lab.nodes[0]).flags


def test_hostlist_expansion_is_slurms(lab, client):
    assert client.expand_hostlist("node[1-3],node1") == ["node1", "node2", "node3"]
    assert client.compress_hostlist(["node1", "node2", "node4"]) == "node[1-2,4]"


def test_comment_and_extra_round_trip(lab, client):
    node = lab.nodes[2]
    history = '{"a":2,"last":"reboot","t":1796231303}'
    try:
        client.set_comment(node, history)
        client.set_extra(node, "gpufleet rack=r7")
        n = client.node(node)
        assert n.comment == history and n.extra == "gpufleet rack=r7"
    finally:
        client.set_comment(node, "")
        client.set_extra(node, "")
    assert client.node(node).comment == ""


def test_reboot_asap_comes_back(lab, client):
    node = lab.nodes[3]
    client.reboot(node, "gpufleet: reboot test", nextstate="resume")
    lab.wait_for(node, lambda sr: sr[0] != "idle", timeout=10)
    lab.wait_for(node, "idle", timeout=40)
    assert not client.node(node).flags & {"DRAIN", "REBOOT_REQUESTED", "REBOOT_ISSUED"}


def test_jobs_and_requeue(lab, client):
    node = lab.nodes[0]
    job = lab.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "-J", "train|llm", "--wrap",
                  "sleep 60").stdout.strip()
    try:
        lab.wait_for(node, {"mixed", "allocated"}, timeout=20)
        jobs = client.jobs(node=node)
        assert [j["job_id"] for j in jobs] == [job] and jobs[0]["name"] == "train|llm"
        assert client.jobs(node=lab.nodes[1]) == []
        client.drain(node, "gpufleet: drain with job")
        assert client.node(node).draining and lab.node_states()[node][0] == "draining"
        client.requeue(job)
        lab.wait_for(node, "drained", timeout=30)
    finally:
        lab.run("scancel", job, check=False)
    with pytest.raises(SlurmError) as e:
        client.jobs(node="nosuchnode")
    assert e.value.kind == "unknown_node"


def test_unreachable_slurmctld_is_a_clear_error(lab):
    conf = lab.dir / "etc" / "unreachable-test.conf"  # inside the lab dir: visible in the 24.11 chroot too
    text = lab.conf.read_text().replace(f"SlurmctldPort={lab.port_base + 17}", "SlurmctldPort=1")
    conf.write_text(text)
    lab_env = dict(lab.env, SLURM_CONF=str(conf))
    c = SlurmClient(backend="cli", env=lab_env)
    try:
        with pytest.raises(SlurmError) as e:
            c.nodes()
    finally:
        conf.unlink()
    assert e.value.kind == "unreachable" and "slurmctld" in str(e.value)
