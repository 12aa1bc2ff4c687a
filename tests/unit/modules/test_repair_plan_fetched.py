# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""repair_plan's fetched reports: the node agent's report.json, fetched from the node (base64, as slurp returns it).
Anything may be in such a file; a genuine agent report is the control."""
from __future__ import annotations

import base64
import json

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import blind
from ansible_collections.gpufleet.reliability.plugins.modules.repair_plan import MAX_REPORT, _fetched

NOW = 1_764_680_000.0
REPORT = {"verdict": "unhealthy", "action": "reset_gpu", "code": "xid48", "gpu": 3, "findings": []}


def b64(obj) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.b64encode(raw).decode()


def test_an_agent_report_of_that_node_is_used_with_its_time():
    agent = dict(REPORT, node="node2", checked_at=NOW - 30, catalog_version="x")  # the agent's --report-file
    reports, times, errors = _fetched({"node2": b64(agent)}, NOW)
    assert reports["node2"]["code"] == "xid48" and times == {"node2": NOW - 30} and errors == {}
    wrapped = {"report": REPORT}  # the gpu_health module's shape, no time: fetched now
    reports, times, errors = _fetched({"node3": b64(wrapped)}, NOW)
    assert reports["node3"]["verdict"] == "unhealthy" and times == {"node3": NOW} and errors == {}


@pytest.mark.parametrize("content, why", [
    (b64(dict(REPORT, node="node9")), "the report is of node 'node9', not of node2"),
    (b64({"node": "node2", "report": dict(REPORT), "checked_at": NOW}) .replace("A", "!"), "expected the base64"),
    (b64(b"\xff\xfe not json"), "cannot read JSON"),
    (b64(b"[" * 100_000 + b"]" * 100_000), "cannot read JSON"),
    (b64({"node": "node2"}), "expected a health report with a verdict"),
    (b64(["node2"]), "expected a health report with a verdict"),
    (b64(b"\"" + b"a" * (MAX_REPORT + 10) + b"\""), "cannot read JSON"),
    (12, "expected the base64"),
], ids=["another node", "not base64", "not utf-8", "deep", "no verdict", "a list", "too long", "not text"])
def test_a_hostile_file_holds_that_node_only_and_says_why(content, why):
    reports, _times, errors = _fetched({"node2": content, "node3": b64(dict(REPORT, node="node3"))}, NOW)
    assert "node2" not in reports and why in errors["node2"] and errors["node2"].startswith("fetched_reports.node2")
    assert "node3" in reports and "node3" not in errors


def test_a_time_that_is_not_a_number_is_now():
    for t in ("yesterday", True, float("nan"), None):
        _r, times, errors = _fetched({"n": b64(dict(REPORT, checked_at=t))}, NOW)
        assert times == {"n": NOW} and errors == {}


def test_blind_lists_the_nodes_a_plan_would_repair_without_a_report():
    decisions = [
        {"node": "a", "code": "no_report", "action": "reboot"},
        {"node": "b", "code": "no_report", "action": "hold"},  # in service: nothing to act on
        {"node": "c", "code": "xid48", "action": "reset_gpu"},
        {"node": "d", "code": "no_report", "action": "replace"},
        {"node": None, "code": "no_report", "action": "reboot"},
        {"code": "no_report", "action": "reboot"},
    ]
    assert blind(decisions) == ["a", "d"]
