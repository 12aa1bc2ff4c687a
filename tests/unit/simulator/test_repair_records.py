"""gpufleet-sim calibrate --nodes: the repair histories kept on the nodes become the repair steps' success and
duration.

Ground truth is the simulator's own runs: ``run --export-history`` writes every write of a node's repair history as
``scontrol show node NAME --json`` lines, and reading those back recovers each step's success probability inside
its 95 % interval in most seeds (a coverage test). Real shapes (Slurm 24.11's ``scontrol show node --json``, the
``scontrol -o show node`` text) are read through the collection's own parsers; hostile dumps are refused by file and
line, and a damaged history is named and left out.
"""
import copy
import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import History, dumps
from gpufleet_sim import repair_records as rr
from gpufleet_sim import scenario as scn
from gpufleet_sim import sources
from gpufleet_sim.brain import default_brain
from gpufleet_sim.engine import Sim
from gpufleet_sim.export import nodes_jsonl
from gpufleet_sim.policies import resolve

REPO = Path(__file__).resolve().parents[3]
TRUTH = REPO / "tests" / "fixtures" / "simulator" / "calibration-truth.yaml"
NODE_JSON = REPO / "tests" / "fixtures" / "slurm" / "scontrol-show-node-json-24.11.json"
SEEDS = 20
T0 = 1_767_000_000


def _history_steps():
    """One node's history as three dumps would show it: a GPU-memory incident whose reset failed and whose reboot
    then cured it (closed by the third dump), and a second incident whose reset is still pending."""
    h = History()
    h.open("gpu_memory", "xid48", 3, T0)
    h.start("reset_gpu", T0 + 60)
    h.ran(T0 + 300)
    h.finish("failed")
    first = dumps(h)
    h.start("reboot", T0 + 600)
    second = dumps(h)
    h.settle("ok", T0 + 1800, cooldown_s=600)
    h.open("gpu_memory", "xid48", 1, T0 + 90_000)
    h.start("reset_gpu", T0 + 90_060)
    third = dumps(h)
    return first, second, third


def _doc(name: str, extra: str) -> str:
    doc = json.loads(NODE_JSON.read_text())  # a real Slurm 24.11 dump, its node's Extra set
    doc["nodes"][0].update(name=name, extra=extra)
    return json.dumps(doc, indent=2)


def test_steps_are_read_from_a_real_node_dump_and_judged_by_what_followed():
    first, second, third = _history_steps()
    lines = "".join(json.dumps(json.loads(_doc("node2", t))) + "\n" for t in (first, second, third))
    steps = rr.steps_of(rr.read_node_dumps(io.StringIO(lines), "nodes.jsonl"))
    got = [(s.action, s.started - T0, s.incident_class, s.outcome, s.ran and s.ran - T0) for s in steps]
    assert sorted(got) == [("reboot", 600, "gpu_memory", "cured", None),
                           ("reset_gpu", 60, "gpu_memory", "failed", 300),
                           ("reset_gpu", 90_060, "gpu_memory", "pending", None)]
    fit = rr.fit_steps(steps)
    assert fit["need"] == {"gpu_memory": "reboot"}  # only a reboot ever cured it here
    assert fit["actions"]["reboot"]["success"] == 1.0
    assert fit["actions"]["reset_gpu"]["able"] == 0  # a step below the class's need proves nothing of its success
    assert fit["incidents"] == 2


def test_one_pretty_dump_and_the_text_dump_read_the_same():
    _first, _second, third = _history_steps()
    pretty = rr.steps_of(rr.read_node_dumps(io.StringIO(_doc("node2", third)), "nodes.json"))
    text = ("NodeName=node2 Arch=x86_64 CoresPerSocket=8 CPUAlloc=0 CPUTot=16 State=IDLE+DRAIN "
            f"Partitions=gpu Comment=(null) Extra={third} Reason=gpufleet: xid48 [root@2026-01-01T00:00:00]\n")
    plain = rr.steps_of(rr.read_node_dumps(io.StringIO(text), "nodes.txt"))
    assert [(s.action, s.started, s.outcome) for s in pretty] == [(s.action, s.started, s.outcome) for s in plain]
    # one dump holds it all: the closed incident's steps in ``r``, its class in ``p``, the open one's steps
    assert sorted(s.outcome for s in plain) == ["cured", "failed", "pending"]


def test_a_history_in_comment_is_read_from_comment_only():
    _first, _second, third = _history_steps()
    doc = json.loads(_doc("node2", ""))
    doc["nodes"][0]["comment"] = third
    text = json.dumps(doc)
    assert rr.steps_of(rr.read_node_dumps(io.StringIO(text), "n")) == []
    assert len(rr.steps_of(rr.read_node_dumps(io.StringIO(text), "n", field="comment"))) == 3
    with pytest.raises(rr.RecordsError, match="history field: expected extra or comment"):
        rr.read_node_dumps(io.StringIO(text), "n", field="reason")


@pytest.mark.parametrize("text, match", [
    ('{"nodes": []}\nnot json\n', r"nodes.jsonl: line 2: not Slurm's node records"),
    ('{"nodes": [{"extra": "x"}]}\n', r"nodes.jsonl: line 1: not Slurm's node records.*missing 'name'"),
    ('{"nodes": "all"}\n', r"nodes.jsonl: line 1: not Slurm's node records"),
    ('[1, 2]\n', r"nodes.jsonl: line 1: not Slurm's node records: expected a JSON document or scontrol"),
    ('{"nodes": [], "errors": [{"error": "Unspecified error"}]}\n{"nodes": 5}\n',  # 1: skipped
     r"nodes.jsonl: line 2: not Slurm's node records"),
    ('{"nodes": [' + '[' * 100_000 + ']' * 100_000 + ']}', r"nodes.jsonl: line 1: not Slurm's node records"),
])
def test_hostile_dumps_are_refused_by_file_and_line(text, match):
    with pytest.raises(rr.RecordsError, match=match):
        rr.read_node_dumps(io.StringIO(text), "nodes.jsonl", problems=[])


def test_a_damaged_or_foreign_history_is_named_or_ignored_never_guessed_at():
    _first, _second, third = _history_steps()
    docs = [_doc("node1", third[: len(third) // 2]),  # ours, truncated
            _doc("node2", "rack 7, ask Bob"),  # somebody else's text
            _doc("node3", third)]
    problems: list = []
    nodes = rr.read_node_dumps(io.StringIO("".join(json.dumps(json.loads(d)) + "\n" for d in docs)), "n.jsonl",
                               problems=problems)
    assert sorted(nodes) == ["node3"]
    assert len(problems) == 1 and problems[0].startswith("n.jsonl: line 1: node node1: "), problems


def test_the_calibrated_scenario_takes_the_steps_and_says_where_they_come_from():
    sc = scn.load(TRUTH)
    raw = copy.deepcopy(sc["raw"])
    raw["estimates"] = [{"path": "repair.actions.reboot.success", "low": 0.5, "high": 1, "source": "estimate; a guess"}]
    fitted = {"actions": {"reboot": {"steps": 40, "cured": 30, "failed": 10, "pending": 0, "able": 40,
                                     "able_cured": 30, "success": 0.75, "ci95": [0.6, 0.86], "durations": 6,
                                     "duration_min": {"median": 12.0, "p90": 20.0}}},
              "need": {"gpu_lost": "reboot"}, "incidents": 38}
    doc = rr.calibrated_repairs(raw, fitted, ["2026-01-01T00:00:00Z", "2026-03-01T00:00:00Z"])
    lognormal = {"dist": "lognormal", "median": 12.0, "p90": 20.0}
    assert doc["repair"]["actions"]["reboot"] == {"success": 0.75, "duration_min": lognormal}
    assert doc["estimates"] == []  # no longer a guess to vary
    back = scn.validate(yaml.safe_load(yaml.safe_dump(doc)), "site.yaml")
    assert back["repair"]["actions"]["reboot"]["success"] == 0.75
    rows = {r["path"]: r for r in sources.resolve(doc, sources.parse_section(doc["sources"], "s"), [])}
    for path in ("repair.actions.reboot.success", "repair.actions.reboot.duration_min"):
        assert rows[path]["kind"] == "site" and rows[path]["how"] == "sources", rows[path]
    site = sorted(p for p, r in rows.items() if p.startswith("repair.actions") and r["kind"] == "site")
    assert site == ["repair.actions.reboot.duration_min", "repair.actions.reboot.success"], site


@pytest.fixture(scope="module")
def truth():
    sc = scn.load(TRUTH)
    return sc, {a: v["success"] for a, v in sc["repair"]["actions"].items()}


def _fit(sc, seed):
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), seed, default_brain(sc))
    sim.vslurm.history_log = []
    sim.run()
    return rr.fit_steps(rr.steps_of(rr.read_node_dumps(io.StringIO(nodes_jsonl(sim.vslurm.history_log)), "n")))


@pytest.mark.slow  # 20 seeds of 120 days: make unit, not make check
def test_exported_histories_recover_each_steps_success(truth):
    """Share of seeds whose 95 % interval holds the scenario's own success probability, per step (printed)."""
    sc, success = truth
    hits: dict = {}
    medians = []
    for seed in range(1, SEEDS + 1):
        fit = _fit(sc, seed)
        for action, row in fit["actions"].items():
            if row["ci95"] is not None:
                lo, hi = row["ci95"]
                hits.setdefault(action, []).append(lo <= success[action] <= hi)
        if "duration_min" in fit["actions"].get("reset_gpu", {}):
            medians.append(fit["actions"]["reset_gpu"]["duration_min"]["median"])
    cover = {a: sum(h) / len(h) for a, h in hits.items()}
    print("coverage of the 95 % intervals of each step's success over", SEEDS, "seeds:", cover)
    assert set(cover) >= {"reset_gpu", "reboot"}, cover
    assert all(c >= 0.9 for c in cover.values()), cover
    # the reset's proven durations: the scenario's lognormal median of 5 min, seed by seed within a few minutes
    medians.sort()
    assert len(medians) == SEEDS and 4.0 <= medians[SEEDS // 2] <= 6.0, medians


def test_a_wrong_success_is_caught_by_the_same_test(truth):
    """Control: the same check against success probabilities the runs were not made with fails."""
    sc, success = truth
    fit = _fit(sc, 1)
    wrong = {a: (0.3 if a == "reset_gpu" else 0.5) for a in success}
    misses = [a for a, row in fit["actions"].items()
              if row["ci95"] and not row["ci95"][0] <= wrong[a] <= row["ci95"][1]]
    assert "reset_gpu" in misses and "reboot" in misses, fit["actions"]


def test_cli_reads_node_dumps_alone_and_writes_the_scenario(tmp_path):
    first, second, third = _history_steps()
    dumps_path = tmp_path / "nodes.jsonl"
    dumps_path.write_text("".join(json.dumps(json.loads(_doc("node2", t))) + "\n" for t in (first, second, third)))
    out = tmp_path / "site.yaml"
    r = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "calibrate", str(TRUTH), "--nodes", str(dumps_path),
                        "--out", str(out), "--json", str(tmp_path / "fit.json")],
                       capture_output=True, text=True, timeout=120, check=False, cwd=REPO / "simulator")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "repair histories: 3 repair steps in 2 incidents" in r.stdout, r.stdout
    doc = yaml.safe_load(out.read_text())
    assert doc["repair"]["actions"]["reboot"]["success"] == 1.0
    assert json.loads((tmp_path / "fit.json").read_text())["repairs"]["need"] == {"gpu_memory": "reboot"}
    bad = subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", "calibrate", str(TRUTH), "--nodes",
                          str(tmp_path / "missing.jsonl")], capture_output=True, text=True, timeout=120, check=False,
                         cwd=REPO / "simulator")
    assert bad.returncode == 2 and "missing.jsonl: cannot read" in bad.stderr, bad.stderr


@pytest.mark.slow  # 20 seeds of 120 days: make unit, not make check
def test_held_out_repairs_by_outcome_are_predicted(truth):
    """The last third of each exported run's steps predicted from the first two: the share of (seed, step) rows whose
    95 % interval holds the observed cures (printed)."""
    sc, _success = truth
    inside, wrong = [], []
    for seed in range(1, SEEDS + 1):
        sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), seed, default_brain(sc))
        sim.vslurm.history_log = []
        sim.run()
        steps = rr.steps_of(rr.read_node_dumps(io.StringIO(nodes_jsonl(sim.vslurm.history_log)), "n"))
        t0, t1 = min(s.started for s in steps), max(s.started for s in steps) + 1
        rows = rr.holdout_steps(steps, t1 - 0.33 * (t1 - t0))
        assert rows and all(r["interval"][0] <= r["predicted"] <= r["interval"][1] for r in rows), rows
        inside += [r["interval"][0] <= r["observed"] <= r["interval"][1] for r in rows]
        # the same check on a past where each step's cures and failures are swapped: it must say so
        cut = t1 - 0.33 * (t1 - t0)
        flip = {"cured": "failed", "failed": "cured"}
        swapped = [dataclasses.replace(s, outcome=flip.get(s.outcome, s.outcome)) if s.started < cut else s
                   for s in steps]
        wrong.append(any(not r["interval"][0] <= r["observed"] <= r["interval"][1]
                         for r in rr.holdout_steps(swapped, cut)))
    share = sum(inside) / len(inside)
    print(f"held-out repairs by outcome: {share:.2f} of {len(inside)} (seed, step) rows inside their interval; "
          f"with the past's outcomes swapped, {sum(wrong)} of {len(wrong)} seeds flag a row")
    assert share >= 0.85, share
    assert sum(wrong) >= 0.9 * len(wrong), wrong


def test_binomial_quantiles_match_known_values():
    assert [rr.binom_quantile(10, 0.5, q) for q in (0.025, 0.5, 0.975)] == [2, 5, 8]
    assert rr.binom_quantile(10, 0.0, 0.975) == 0 and rr.binom_quantile(10, 1.0, 0.025) == 10
    assert rr.binom_quantile(5000, 0.5, 0.975) == 2569  # the normal approximation past 2,000 trials
