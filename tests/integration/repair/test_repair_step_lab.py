# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""repair_step against the real Slurm lab: never touches what is not ours, idempotent, check mode changes nothing."""

from __future__ import annotations

import json
import time

import pytest

from support.ansible_cli import run_module

pytestmark = pytest.mark.lab


def step(args, check=False):
    return run_module("repair_step", args, check=check)


def extra(lab, node):
    for line in lab.run("scontrol", "show", "node", node).stdout.splitlines():
        if line.strip().startswith("Extra="):
            return line.strip()[len("Extra="):]
    return ""


def test_foreign_nodes_are_never_touched(lab):
    n = lab.nodes[0]
    lab.run("scontrol", "update", f"NodeName={n}", "State=DRAIN", "Reason=maintenance: psu")
    for args in ({"op": "resume"}, {"op": "drain", "reason": "gpufleet: xid48 gpu3"},
                 {"op": "escalate", "reason": "gpufleet: escalated"}, {"op": "spare_in"}):
        ok, res = step(dict(args, node=n))
        assert not ok, (args, res)
    assert lab.node_states()[n] == ("drained", "maintenance: psu")
    m = lab.nodes[1]
    lab.run("scontrol", "update", f"NodeName={m}", "Extra=rack 12 slot 3")
    try:
        ok, res = step({"node": m, "op": "record", "history": '{"gf":1,"n":1}'})
        assert not ok and "not a gpufleet history" in res["msg"]
        assert extra(lab, m) == "rack 12 slot 3"
    finally:
        lab.run("scontrol", "update", f"NodeName={m}", "Extra=")


def test_drain_is_idempotent_and_check_mode_changes_nothing(lab):
    n = lab.nodes[1]
    # on Slurm 24.11 an idle node may still show the reason of an earlier drain (kept after RESUME): compare
    # with what it was before, and require the state idle
    before = lab.node_states()[n]
    assert before[0] == "idle", before
    ok, res = step({"node": n, "op": "drain", "reason": "gpufleet: xid79 gpu1"}, check=True)
    assert ok and res["changed"] and lab.node_states()[n] == before
    ok, res = step({"node": n, "op": "drain", "reason": "gpufleet: xid79 gpu1"})
    assert ok and res["changed"]
    lab.wait_for(n, {"drained"})
    ok, res = step({"node": n, "op": "drain", "reason": "gpufleet: xid79 gpu1"})
    assert ok and not res["changed"]
    ok, res = step({"node": n, "op": "drain", "reason": "xid79 without our prefix"})
    assert not ok and "must start with" in res["msg"]


def test_history_record_and_outcome(lab):
    n = lab.nodes[2]
    lab.run("scontrol", "update", f"NodeName={n}", "State=DRAIN", "Reason=gpufleet: xid48 gpu3")
    pending = '{"gf":1,"i":{"c":"gm","g":3,"id":1,"k":"xid48","s":[["g",1796232119,null]],"t":1796232014},"n":1}'
    try:
        ok, res = step({"node": n, "op": "record", "history": pending})
        assert ok and res["changed"] and extra(lab, n) == pending
        ok, res = step({"node": n, "op": "record", "history": pending})
        assert ok and not res["changed"]
        # a check of a reset nothing shows ran says nothing about the reset: recorded unproven, incident open
        ok, res = step({"node": n, "op": "outcome", "outcome": "ok", "cooldown": 60})
        assert ok and res["changed"]
        stored = json.loads(extra(lab, n))
        assert stored["i"]["s"] == [["g", 1796232119, "u"]] and "cd" not in stored, stored
        ok, res = step({"node": n, "op": "record", "history": pending})
        ok, res = step({"node": n, "op": "ran"})  # the proof the reset leaves right after it returned
        assert ok and res["changed"]
        ran = json.loads(extra(lab, n))["i"]["s"][0]
        assert ran[:3] == ["g", 1796232119, None] and abs(ran[3] - time.time()) < 120, ran
        ok, res = step({"node": n, "op": "ran"})
        assert ok and not res["changed"]  # the first proof stays
        ok, res = step({"node": n, "op": "outcome", "outcome": "ok", "cooldown": 60})
        assert ok and res["changed"]
        stored = json.loads(extra(lab, n))
        assert "i" not in stored and stored["p"] == "gm1796232014" and "cd" in stored
        # a reboot of this node after the intent is its proof (Slurm's boot time); a reboot not seen is unproven
        for started, want in ((1, "f"), (2 ** 31 - 1, "u")):
            text = json.dumps({"gf": 1, "i": {"c": "gm", "g": 3, "id": 1, "k": "xid48", "s": [["b", started, None]],
                                              "t": 1}, "n": 1})
            assert step({"node": n, "op": "record", "history": text})[0]
            ok, res = step({"node": n, "op": "outcome", "outcome": "failed"})
            assert ok and json.loads(extra(lab, n))["i"]["s"][0][2] == want, (started, extra(lab, n))
    finally:
        lab.run("scontrol", "update", f"NodeName={n}", "Extra=")


def test_escalate_drains_a_node_in_service_that_shows_the_same_old_reason(lab):
    # Slurm 24.11 keeps the last reason after RESUME (22.05 clears it): a reason equal to ours on an idle node is a
    # leftover, not our escalation, so escalate must still drain it
    n = lab.nodes[-1]
    reason = "gpufleet: escalated: lab test"
    lab.run("scontrol", "update", f"NodeName={n}", "State=DRAIN", f"Reason={reason}")
    lab.wait_for(n, {"drained"})
    lab.run("scontrol", "update", f"NodeName={n}", "State=RESUME")
    lab.wait_for(n, {"idle"})
    ok, res = step({"node": n, "op": "escalate", "reason": reason})
    assert ok and res["changed"], res
    assert lab.wait_for(n, {"drained"}) == ("drained", reason)
    ok, res = step({"node": n, "op": "escalate", "reason": reason})
    assert ok and not res["changed"], res


def test_check_refuses_a_node_that_is_not_ours_any_more_and_note_only_touches_ours(lab):
    n, m = lab.nodes[0], lab.nodes[1]
    lab.run("scontrol", "update", f"NodeName={n}", "State=DRAIN", "Reason=gpufleet: xid79 gpu3")
    ok, res = step({"node": n, "op": "check"})
    assert ok and not res["changed"], res
    ok, res = step({"node": n, "op": "note", "reason": "gpufleet: held: lab"})
    assert ok and res["changed"] and lab.wait_for(n, {"drained"}) == ("drained", "gpufleet: held: lab")
    # an operator takes it over: check fails (the role stops before the reset / reboot / hook), note leaves it alone
    lab.run("scontrol", "update", f"NodeName={n}", "State=DRAIN", "Reason=ops: cable")
    ok, res = step({"node": n, "op": "check"})
    assert not ok and "someone else" in res["msg"], res
    ok, res = step({"node": n, "op": "note", "reason": "gpufleet: held: lab"})
    assert ok and not res["changed"] and lab.node_states()[n] == ("drained", "ops: cable")
    # in service: nothing to note; a damaged history of ours is refused by check
    ok, res = step({"node": m, "op": "note", "reason": "gpufleet: held: lab"})
    assert ok and not res["changed"] and lab.node_states()[m][0] == "idle"
    lab.run("scontrol", "update", f"NodeName={m}", 'Extra={"gf":1,"i":{"c":"gl"')
    try:
        ok, res = step({"node": m, "op": "check"})
        assert not ok and "damaged" in res["msg"], res
    finally:
        lab.run("scontrol", "update", f"NodeName={m}", "Extra=")
