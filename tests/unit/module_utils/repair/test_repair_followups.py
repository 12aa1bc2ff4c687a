# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""followups(): when the event loop runs again for a node without a new alert (issue 27 case 11: a reset whose
verification failed waited 431 s for an unrelated alert before its reboot)."""
from __future__ import annotations

from repair_builders import NOW, fleet, hist, node

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import RepairConfig, followups, plan

D = {"node": "n1", "action": "wait", "earliest": NOW + 600, "needs_approval": False}


def test_a_step_that_did_not_give_the_node_back_is_followed_up_soon():
    failed = {"node": "n1", "action": "reset_gpu", "failed": True}
    unhealthy = {"node": "n2", "action": "reset_gpu", "failed": False, "verified": "unhealthy", "resumed": False}
    fine = {"node": "n3", "action": "reboot", "failed": False, "verified": "healthy", "resumed": True}
    resume = {"node": "n4", "action": "resume", "failed": False, "verified": None, "resumed": True}
    predicted = {"node": "n5", "action": "reboot", "failed": False, "verified": "unhealthy", "check_mode": True}
    assert followups([], [failed, unhealthy, fine, resume, predicted], NOW) == {"n1": NOW + 60, "n2": NOW + 60}
    assert followups([], [failed], NOW, min_delay=5) == {"n1": NOW + 5}


def test_a_wait_of_our_own_is_followed_up_at_its_time_and_a_person_s_wait_is_not():
    assert followups([D], [], NOW) == {"n1": NOW + 600}
    assert followups([dict(D, earliest=NOW + 10)], [], NOW) == {"n1": NOW + 60}  # never sooner than min_delay
    for other in ({"needs_approval": True}, {"action": "hold"}, {"action": "reboot"}, {"earliest": None},
                  {"earliest": float("inf")}, {"earliest": True}, {"node": ""}, {"node": 7}):
        assert followups([dict(D, **other)], [], NOW) == {}, other
    # a step that ran and failed is due sooner than the node's decision said
    assert followups([D], [{"node": "n1", "action": "reset_gpu", "failed": True}], NOW) == {"n1": NOW + 60}


def test_plans_decisions_ask_for_follow_ups_where_the_brain_waits():
    cfg = RepairConfig.from_dict({"ttl": "5m"})
    p = plan(fleet(), [node(history=hist(t0=NOW - 60))], cfg, NOW)  # the finding is a minute old: TTL
    (d,) = p
    assert (d.action, d.rule) == ("wait", "ttl")
    assert followups([d.to_dict()], [], NOW) == {"node2": int(d.earliest)}
