"""The shipped Prometheus alert rules and Grafana dashboard, checked with the real promtool.

`promtool test rules` runs the unit tests in monitoring/prometheus/tests (each case with a control that must not
fire); a copy of the rules with one threshold changed must make them fail (the tests can fail). The dashboard:
the structure Grafana needs (panels, grid, targets, the datasource variable) and every query parses."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from conftest import MONITORING, REPO, need

RULES = MONITORING / "prometheus" / "gpufleet-alerts.yml"
RULE_TESTS = MONITORING / "prometheus" / "tests" / "gpufleet-alerts.test.yml"
DASHBOARD = MONITORING / "grafana" / "gpufleet-dashboard.json"


def promtool(*args, cwd=None):
    return subprocess.run([need("promtool"), *map(str, args)], capture_output=True, text=True, check=False,
                          cwd=cwd, timeout=120)


def test_rules_are_valid():
    p = promtool("check", "rules", RULES)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS: 15 rules found" in p.stdout


def test_rule_unit_tests_pass():
    p = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("old,new", [("for: 4h", "for: 1h"), ("> 900", "> 9000"), ("> 7200", "> 72000"),
                                     ('code=~"gpu_lost|gpu_missing|xid79"', 'code=~"gpu_lost|gpu_missing"')])
def test_rule_unit_tests_catch_a_changed_rule(tmp_path, old, new):
    (tmp_path / "tests").mkdir()
    text = RULES.read_text()
    assert old in text
    (tmp_path / RULES.name).write_text(text.replace(old, new, 1))
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    p = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path / "tests")
    assert p.returncode != 0, "the rule tests did not notice the change " + old


def test_every_alert_has_labels_and_summary():
    import yaml
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = [r for g in groups for r in g["rules"]]
    names = {r["alert"] for r in alerts}
    assert {"GpufleetGpuLost", "GpufleetXidGpuReset", "GpufleetXidNodeReboot", "GpufleetGpuReplace",
            "GpufleetNodeDrainedTooLong", "GpufleetRepairFailed", "GpufleetRepairEscalated",
            "GpufleetRepairBreakerOpen", "GpufleetAgentSilent"} <= names
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert names - {"GpufleetTextfileUnreadable"} <= tested, names - tested
    used = set(re.findall(r"\b(gpufleet_[a-z_]+)\b(?![.])", RULES.read_text())) - {"gpufleet_repair"}
    assert not used - documented_metrics(), used - documented_metrics()
    for r in alerts:
        assert r["labels"]["severity"] in ("page", "ticket") and r["labels"]["component"], r["alert"]
        assert r["annotations"]["summary"], r["alert"]


def documented_metrics():
    doc = (REPO / "docs" / "health.md").read_text() + (REPO / "docs" / "loop.md").read_text()
    return set(re.findall(r"`(gpufleet_[a-z_]+)`", doc))


def test_dashboard_structure():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    occupied = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"panel {p['title']} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["type"] in ("stat", "timeseries", "table", "gauge"), p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), p["title"]


def test_dashboard_queries_parse_and_use_documented_metrics(tmp_path):
    import yaml
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    node_var = d["templating"]["list"][1]["definition"]
    exprs.append(re.sub(r"label_values\((\w+), (\w+)\)", r"count by (\2) (\1)", node_var))
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e.replace("$node", ".*")} for i, e in enumerate(exprs)]}]}
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump(rules))
    p = promtool("check", "rules", f)
    assert p.returncode == 0, p.stdout + p.stderr
    used = set(re.findall(r"\b(gpufleet_[a-z_]+)\b", " ".join(exprs)))
    missing = used - documented_metrics()
    assert not missing, f"dashboard uses undocumented metrics: {missing}"
    # a broken query is noticed
    f.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (node"}]}]}))
    assert promtool("check", "rules", f).returncode != 0


def test_alertmanager_example_is_valid():
    p = subprocess.run([need("amtool"), "check-config", str(MONITORING / "alertmanager" / "alertmanager.yml")],
                       capture_output=True, text=True, check=False, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
