# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm adapter: parsers against real captured outputs (tests/fixtures/slurm), command construction and
backend selection. Behaviour against real daemons is in tests/integration/test_slurm_adapter.py."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import slurm
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import (
    Node,
    SlurmClient,
    SlurmError,
    parse_nodes_json,
    parse_nodes_text,
    parse_version,
    select_backend,
    split_hostlist_expr,
    split_state,
)

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def sample(name):
    return (FIX / name).read_text()


def text_block(title):
    """The output under a '$ <title>' heading of text-outputs-22.05.txt."""
    out, grab = [], False
    for line in sample("text-outputs-22.05.txt").splitlines():
        if line.startswith("$ "):
            grab = line[2:].startswith(title)
            continue
        if grab:
            out.append(line)
    return "\n".join(out)


# ---- parsers ---------------------------------------------------------------------------------------------
def test_sinfo_json_2205():
    nodes = parse_nodes_json(sample("sinfo-json-22.05.json"))
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    n1, n2, n3, n4 = (nodes[f"node{i}"] for i in range(1, 5))
    assert (n1.state, n1.flags, n1.sinfo_state) == ("idle", frozenset(), "idle")
    assert n2.drained and not n2.draining and n2.sinfo_state == "drained"
    assert n2.reason == "xid 79" and n2.reason_user == "root" and isinstance(n2.reason_time, int)
    assert n3.state == "mixed" and n3.draining and not n3.drained and n3.sinfo_state == "draining"
    assert n3.gres == "gpu:h100:8" and n3.gres_used == "gpu:h100:4(IDX:0-3)"
    assert n4.is_down and n4.reason == "gpu fell off the bus" and n4.sinfo_state == "down"
    assert n1.partitions == ["gpu"] and n1.features == [] and n1.boot_time == 1796216379
    assert n1.reason_time is None and n1.reason_user == ""
    assert n3.next_state == ""  # "invalid" means none


def test_scontrol_json_2411():
    nodes = parse_nodes_json(sample("scontrol-show-node-json-24.11.json"))
    n2 = nodes["node2"]
    assert (n2.state, n2.flags) == ("idle", frozenset({"DRAIN"}))
    assert n2.drained and n2.reason == "xid 79" and n2.reason_time == 1796218765
    assert n2.boot_time == 1796216379 and n2.partitions == ["gpu"] and n2.version == "24.11.5"
    assert n2.gres_used == "gpu:h100:0(IDX:N/A)"


def test_sinfo_json_2411_rows_merge_per_node():
    nodes = parse_nodes_json(sample("sinfo-json-24.11.json"))
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    assert nodes["node2"].drained and nodes["node2"].reason == "xid 79"
    assert nodes["node2"].reason_user == "root" and nodes["node2"].reason_time == 1796218765
    assert nodes["node1"].state == "idle" and not nodes["node1"].flags
    assert nodes["node1"].reason_time is None
    assert nodes["node4"].partitions == ["gpu"]


def test_the_three_shapes_agree_on_node2():
    a = parse_nodes_json(sample("sinfo-json-22.05.json"))["node2"]
    b = parse_nodes_json(sample("scontrol-show-node-json-24.11.json"))["node2"]
    c = parse_nodes_json(sample("sinfo-json-24.11.json"))["node2"]
    for n in (b, c):
        assert (n.state, n.flags, n.reason, n.reason_user) == (a.state, a.flags, a.reason, a.reason_user)


def test_scontrol_text_one_line():
    nodes = parse_nodes_text(text_block("scontrol -o show node node4"))
    n4 = nodes["node4"]
    assert n4.state == "down" and n4.reason == "gpu fell off the bus" and n4.reason_user == "root"
    assert isinstance(n4.reason_time, int) and n4.partitions == ["gpu"] and n4.gres == "gpu:h100:8"
    assert n4.features == [] and n4.cpus == 16 and n4.version == "22.05.8"


def test_scontrol_text_free_text_fields_keep_spaces_and_equals():
    line = ("NodeName=gpu7 Arch=x86_64 CoresPerSocket=16  CPUAlloc=0 CPUTot=16 AvailableFeatures=h100,ib "
            "ActiveFeatures=h100,ib Gres=gpu:h100:8 GresUsed=gpu:h100:2(IDX:0-1) NodeAddr=10.0.0.7 "
            "OS=Linux 6.1 #1 SMP State=MIXED+DRAIN+REBOOT_REQUESTED Partitions=gpu,debug  "
            "BootTime=2026-12-02T12:59:39 Comment={\"n\":1, \"a\":\"x=y z\"} Extra=hello world "
            "Reason=ecc: dbe on gpu2 = bad [alice@2026-12-02T13:36:04]")
    n = parse_nodes_text(line)["gpu7"]
    assert n.comment == '{"n":1, "a":"x=y z"}' and n.extra == "hello world"
    assert n.reason == "ecc: dbe on gpu2 = bad" and n.reason_user == "alice"
    assert n.flags == frozenset({"DRAIN", "REBOOT_REQUESTED"}) and n.sinfo_state == "draining@"
    assert n.features == ["h100", "ib"] and n.partitions == ["gpu", "debug"]


def test_bad_json_is_a_parse_error():
    with pytest.raises(SlurmError) as e:
        parse_nodes_json("{not json")
    assert e.value.kind == "parse"
    with pytest.raises(SlurmError) as e:
        parse_nodes_json('{"meta": {}}')
    assert e.value.kind == "parse"


def test_json_errors_without_nodes_are_reported():
    with pytest.raises(SlurmError) as e:
        parse_nodes_json('{"errors":[{"error":"Unspecified error","errno":-1}],"nodes":[]}')
    assert e.value.kind == "command" and "Unspecified error" in e.value.msg


@pytest.mark.parametrize("state,flags,base,want_flags,sinfo", [
    ("IDLE", (), "idle", set(), "idle"),
    ("IDLE*+DRAIN", (), "idle", {"DRAIN", "NOT_RESPONDING"}, "drained*"),
    ("DOWN+NOT_RESPONDING", (), "down", {"NOT_RESPONDING"}, "down*"),
    (["IDLE", "DRAIN", "REBOOT_REQUESTED"], (), "idle", {"DRAIN", "REBOOT_REQUESTED"}, "drained@"),
    ("DOWN+DRAIN+REBOOT_ISSUED", (), "down", {"DRAIN", "REBOOT_ISSUED"}, "reboot^"),
    ("IDLE+REBOOT_REQUESTED", (), "idle", {"REBOOT_REQUESTED"}, "reboot"),
    ("mixed", ["DRAIN"], "mixed", {"DRAIN"}, "draining"),
    ("IDLE+COMPLETING", (), "idle", {"COMPLETING"}, "completing"),
    ("IDLE+DRAIN+COMPLETING", (), "idle", {"DRAIN", "COMPLETING"}, "draining"),
    ("ALLOCATED", (), "allocated", set(), "allocated"),
    ("", (), "unknown", set(), "unknown"),
])
def test_states(state, flags, base, want_flags, sinfo):
    b, f = split_state(state, flags)
    assert (b, set(f)) == (base, want_flags)
    assert Node("n", state=b, flags=f).sinfo_state == sinfo


def test_version_parse():
    assert parse_version("slurm-wlm 22.05.8\n") == (22, 5, 8)
    assert parse_version("slurm 24.11.5") == (24, 11, 5)
    with pytest.raises(SlurmError):
        parse_version("no version here")


@pytest.mark.parametrize("expr,parts", [
    ("node1", ["node1"]),
    ("node[1-3],gpu[01,05]x,n9", ["node[1-3]", "gpu[01,05]x", "n9"]),
    (["node1", "node[2-3]"], ["node1", "node[2-3]"]),
])
def test_hostlist_split(expr, parts):
    assert split_hostlist_expr(expr) == parts


@pytest.mark.parametrize("bad", ["", "node[1-", "node]1", "node 1", "node1;rm -rf /", [""]])
def test_hostlist_split_rejects(bad):
    with pytest.raises(ValueError):
        split_hostlist_expr(bad)


# ---- client command construction (runner replays real outputs) -------------------------------------------
class Replay:
    """A runner that answers from captured 22.05 outputs and records every argv."""

    def __init__(self, version="slurm-wlm 22.05.8", nodes_json=None, fail=None):
        self.calls = []
        self.version = version
        self.nodes_json = nodes_json or sample("sinfo-json-22.05.json")
        self.fail = fail or {}

    def __call__(self, argv):
        self.calls.append(argv)
        key = " ".join(argv[:3])
        for prefix, answer in self.fail.items():
            if " ".join(argv).startswith(prefix):
                return answer
        if argv[1:] == ["--version"]:
            return 0, self.version + "\n", ""
        if argv[:4] == ["scontrol", "show", "node", "--json"] and len(argv) == 5:  # Slurm 23.02+: those nodes only
            data = json.loads(self.nodes_json)
            data["nodes"] = [n for n in data["nodes"] if n["name"] in argv[4].split(",")]
            return 0, json.dumps(data), ""
        if argv[:2] == ["sinfo", "--json"] or argv[:4] == ["scontrol", "show", "node", "--json"]:
            return 0, self.nodes_json, ""
        if key == "scontrol show hostnames":
            return 0, "\n".join(_expand(argv[3])) + "\n", ""
        if key == "scontrol show hostlist":
            return 0, "HL(" + argv[3] + ")\n", ""
        if argv[:2] == ["scontrol", "ping"]:
            return 0, "Slurmctld(primary) at localhost is UP\n", ""
        return 0, "", ""

    def updates(self):
        return [c for c in self.calls if c[:2] in (["scontrol", "update"], ["scontrol", "reboot"])]


def _expand(expr):
    out = []
    for part in split_hostlist_expr(expr):
        if "[" in part:
            pre, rng = part.split("[")
            a, b = rng.rstrip("]").split("-")
            out += [f"{pre}{i}" for i in range(int(a), int(b) + 1)]
        else:
            out.append(part)
    return out


def test_drain_is_one_batched_update_after_validation():
    r = Replay()
    c = SlurmClient(runner=r, backend="cli")
    assert c.drain("node[1-3]", "xid 79") == ["node1", "node2", "node3"]
    assert r.updates() == [["scontrol", "update", "NodeName=HL(node1,node2,node3)", "State=DRAIN", "Reason=xid 79"]]


def test_unknown_node_changes_nothing():
    r = Replay()
    c = SlurmClient(runner=r, backend="cli")
    with pytest.raises(SlurmError) as e:
        c.drain("node1,node9", "xid 79")
    assert e.value.kind == "unknown_node" and "node9" in e.value.msg
    assert r.updates() == []
    with pytest.raises(SlurmError) as e:
        c.node("node9")
    assert e.value.kind == "unknown_node"


def test_resume_skips_nodes_that_need_no_resume():
    r = Replay()
    c = SlurmClient(runner=r, backend="cli")
    assert c.resume("node[1-4]") == ["node2", "node3", "node4"]
    assert r.updates() == [["scontrol", "update", "NodeName=HL(node2,node3,node4)", "State=RESUME"]]
    r2 = Replay()
    assert SlurmClient(runner=r2, backend="cli").resume("node1") == [] and r2.updates() == []


def test_reason_required_and_nextstate_checked():
    c = SlurmClient(runner=Replay(), backend="cli")
    for fn in (c.drain, c.down):
        with pytest.raises(ValueError, match="reason is required"):
            fn("node1", "  ")
    with pytest.raises(ValueError, match="nextstate"):
        c.reboot("node1", "x", nextstate="sideways")


def test_reboot_command():
    r = Replay()
    SlurmClient(runner=r, backend="cli").reboot("node3", "xid 79 reboot", nextstate="down")
    assert r.updates() == [["scontrol", "reboot", "ASAP", "nextstate=DOWN", "reason=xid 79 reboot", "node3"]]


def test_json_source_follows_the_version():
    r = Replay(version="slurm 24.11.5", nodes_json=sample("scontrol-show-node-json-24.11.json"))
    c = SlurmClient(runner=r, backend="cli")
    assert c.node("node2").drained
    assert r.calls[-1] == ["scontrol", "show", "node", "--json", "node2"]  # that node only
    assert set(c.nodes()) == {"node2"}  # the capture holds one node
    assert r.calls[-1] == ["scontrol", "show", "node", "--json"]
    with pytest.raises(SlurmError) as e:
        c.node("node9")  # 24.11 answers an unknown name with no nodes and rc 0
    assert e.value.kind == "unknown_node"
    many = [f"node{i}" for i in range(1, 100)]
    with pytest.raises(SlurmError):
        c.nodes(many)  # more than a few names: the whole fleet is read (and the others are unknown)
    assert r.calls[-1] == ["scontrol", "show", "node", "--json"]
    r = Replay()
    SlurmClient(runner=r, backend="cli").nodes("node2")
    assert r.calls[-1] == ["sinfo", "--json"]  # 22.05's sinfo ignores -n: the fleet, filtered here


def test_one_plain_name_is_changed_without_a_read_and_history_goes_with_the_state():
    r = Replay(version="slurm 24.11.5", nodes_json=sample("scontrol-show-node-json-24.11.json"))
    c = SlurmClient(runner=r, backend="cli")
    c.drain("node3", "xid 79")  # not in the capture: no read is made to find that out
    c.update_node("node3", history_field="extra", history='{"gf":1}', state="RESUME")
    c.update_node("node3", history_field="comment", history='{"gf":1}', state="DRAIN", reason="gpufleet: x")
    assert not [a for a in r.calls if a[1:3] == ["show", "node"] or a[0] == "sinfo"]
    assert r.updates() == [["scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=xid 79"],
                           ["scontrol", "update", "NodeName=node3", 'Extra={"gf":1}', "State=RESUME"],
                           ["scontrol", "update", "NodeName=node3", 'Comment={"gf":1}', "State=DRAIN",
                            "Reason=gpufleet: x"]]
    assert c.update_node("node3") == [] and len(r.updates()) == 3
    with pytest.raises(ValueError, match="one node name"):
        c.update_node("node[1-2]", state="RESUME")
    with pytest.raises(ValueError, match="state must be DRAIN or RESUME"):
        c.update_node("node3", state="DOWN")
    with pytest.raises(ValueError, match="reason is required"):
        c.update_node("node3", state="DRAIN")
    with pytest.raises(ValueError, match="must be one line"):
        c.update_node("node3", history_field="extra", history="a\nb")
    # an unknown single name: Slurm refuses it whole, and the error is classified
    r2 = Replay(fail={"scontrol update": (1, "", "slurm_update error: Invalid node name specified\n")})
    with pytest.raises(SlurmError) as e:
        SlurmClient(runner=r2, backend="cli").drain("node9", "xid 79")
    assert e.value.kind == "unknown_node"


def test_errors_are_classified():
    down = (1, "", "slurm_load_node error: Unable to contact slurm controller (connect failure)\n")
    r = Replay(fail={"sinfo --json": down})
    with pytest.raises(SlurmError) as e:
        SlurmClient(runner=r, backend="cli").nodes()
    assert e.value.kind == "unreachable" and "slurmctld unreachable" in e.value.msg
    # 22.05 sinfo --json exits 0 with an error list when slurmctld is down; scontrol ping tells
    dead = '{"errors":[{"error":"Unspecified error","errno":-1}],"nodes":[]}'
    r = Replay(nodes_json=dead, fail={"scontrol ping": (1, "Slurmctld(primary) at vm is DOWN\n*****\n", "")})
    with pytest.raises(SlurmError) as e:
        SlurmClient(runner=r, backend="cli").nodes()
    assert e.value.kind == "unreachable" and "is DOWN" in e.value.msg
    r = Replay(fail={"scontrol update": (1, "", "slurm_update error: Invalid node state specified\n")})
    with pytest.raises(SlurmError) as e:
        SlurmClient(runner=r, backend="cli").drain("node1", "x")
    assert e.value.kind == "command" and e.value.rc == 1 and "Invalid node state" in e.value.stderr
    r = Replay(fail={"scontrol --version": (127, "", "scontrol: command not found")})
    with pytest.raises(SlurmError, match="not found"):
        SlurmClient(runner=r, backend="cli").version()


def test_jobs_parse():
    sep = "\x1f"
    line = sep.join(["42", "COMPLETING", "root", "node3", "1:02", "2026-12-02T13:36:04", "None", "a|b name"])
    r = Replay(fail={"squeue": (0, line + "\n", "")})
    jobs = SlurmClient(runner=r, backend="cli").jobs(states=["CG"])
    assert jobs == [{"job_id": "42", "state": "COMPLETING", "user": "root", "nodes": "node3", "elapsed": "1:02",
                     "end_time": jobs[0]["end_time"], "reason": "None", "name": "a|b name"}]
    assert isinstance(jobs[0]["end_time"], int)


def test_requeue_checks_job_id():
    r = Replay()
    c = SlurmClient(runner=r, backend="cli")
    assert c.requeue(17) == "17"
    assert ["scontrol", "requeue", "17"] in r.calls
    with pytest.raises(ValueError):
        c.requeue("17; reboot")


def test_set_extra_falls_back_to_comment_before_2205():
    r = Replay(version="slurm 21.08.8")
    c = SlurmClient(runner=r, backend="cli")
    c.set_extra("node1", "x")
    assert r.updates()[-1] == ["scontrol", "update", "NodeName=node1", "Comment=x"]
    r = Replay()
    SlurmClient(runner=r, backend="cli").set_extra("node1", "x")
    assert r.updates()[-1] == ["scontrol", "update", "NodeName=node1", "Extra=x"]


# ---- backend selection -----------------------------------------------------------------------------------
def fake_pyslurm(version, with_api=True):
    mod = types.ModuleType("pyslurm")
    mod.__version__ = version
    if with_api:
        mod.Node = type("Node", (), {})
        mod.Nodes = type("Nodes", (), {})
    return mod


@pytest.mark.parametrize("requested,mod,sv,want", [
    ("cli", fake_pyslurm("22.5.3"), (22, 5, 8), "cli"),
    ("auto", None, (22, 5, 8), "cli"),
    ("auto", fake_pyslurm("22.5.3"), (22, 5, 8), "pyslurm"),
    ("auto", fake_pyslurm("25.11.2"), (22, 5, 8), "cli"),
    ("auto", fake_pyslurm("24.11.0"), (24, 11, 5), "pyslurm"),
    ("auto", fake_pyslurm("22.5.3", with_api=False), (22, 5, 8), "cli"),
    ("auto", fake_pyslurm("garbage"), (22, 5, 8), "cli"),
])
def test_select_backend(requested, mod, sv, want):
    assert select_backend(requested, mod, sv)[0] == want


def test_select_backend_pyslurm_requested_but_unusable_is_an_error():
    with pytest.raises(SlurmError, match="cannot be imported"):
        select_backend("pyslurm", None, (22, 5, 8))
    with pytest.raises(SlurmError, match="does not match Slurm 22.05"):
        select_backend("pyslurm", fake_pyslurm("25.11.2"), (22, 5, 8))
    with pytest.raises(ValueError):
        select_backend("rest", None, None)


def test_client_auto_uses_cli_here_because_pyslurm_is_absent(monkeypatch):
    """On this machine pyslurm is not installable (PyPI has none for Debian's Slurm): auto means cli."""
    monkeypatch.setattr(slurm.pyslurm_backend, "import_pyslurm", lambda: None)
    c = SlurmClient(runner=Replay(), backend="auto")
    assert c.backend == "cli" and c.backend_reason == "pyslurm not importable"


def test_client_auto_picks_matching_pyslurm(monkeypatch):
    mod = fake_pyslurm("22.5.3")
    monkeypatch.setattr(slurm.pyslurm_backend, "import_pyslurm", lambda: mod)
    c = SlurmClient(runner=Replay(), backend="auto")
    assert c.backend == "pyslurm" and "matches Slurm 22.05" in c.backend_reason


def recording_pyslurm(version, fail=None):
    """A pyslurm stand-in that records Node.modify calls (pyslurm is not installable here; the real module's
    call shapes are pyslurm 23.02+'s: Node(name).modify(Node(**changes)))."""
    mod = fake_pyslurm(version)
    calls = []

    class Node:
        def __init__(self, name=None, **changes):
            self.name, self.changes = name, changes

        def modify(self, changes):
            if fail:
                raise RuntimeError(fail)
            calls.append((self.name, changes.changes))

    mod.Node, mod.calls = Node, calls
    return mod


def test_pyslurm_backend_changes_all_nodes_in_one_update(monkeypatch):
    mod = recording_pyslurm("22.5.3")
    monkeypatch.setattr(slurm.pyslurm_backend, "import_pyslurm", lambda: mod)
    c = SlurmClient(runner=Replay(), backend="pyslurm")
    monkeypatch.setattr(c, "nodes", lambda names: {n: None for n in ("node1", "node2", "node3")})
    assert c.drain("node[1-3]", "gpufleet: rack r7") == ["node1", "node2", "node3"]
    assert mod.calls == [("node1,node2,node3", {"state": "DRAIN", "reason": "gpufleet: rack r7"})]


def test_pyslurm_backend_errors_are_classified(monkeypatch):
    for text, kind in (("Invalid node name specified", "unknown_node"), ("boom", "command")):
        mod = recording_pyslurm("22.5.3", fail=text)
        monkeypatch.setattr(slurm.pyslurm_backend, "import_pyslurm", lambda mod=mod: mod)
        c = SlurmClient(runner=Replay(), backend="pyslurm")
        monkeypatch.setattr(c, "nodes", lambda names: {"node1": None})
        with pytest.raises(SlurmError) as err:
            c.down("node1", "gpufleet: x")
        assert err.value.kind == kind
