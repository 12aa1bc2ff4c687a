"""Every input of a scenario says where it comes from: a paper, the site's own records, or an estimate with its range
(issue: the simulator's answer survives its own assumptions, item 2)."""

import copy

import pytest

from gpufleet_sim import report, sources
from gpufleet_sim import scenario as scn
from gpufleet_sim import validate as val
from gpufleet_sim.dists import SpecError

SHIPPED = sorted(val.SCENARIOS.glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_input_of_a_shipped_scenario_has_a_source(path):
    sc = scn.load(path)
    rows = sc["input_sources"]
    assert len(rows) >= 30, rows  # the catalogue reaches every section, not only the top level
    missing = [r["path"] for r in rows if r["how"] == "unsourced"]
    assert not missing, missing
    for r in rows:
        assert r["kind"] in ("paper", "site", "estimate"), r
        if r["kind"] == "estimate":
            assert r["source"].get("low") is not None and r["source"].get("high") is not None, r
        if r["kind"] == "paper":
            assert len(sources.describe(r["source"])) > 20, r
    assert "say nowhere" not in sources.summary(rows)


def _bare() -> dict:
    raw = copy.deepcopy(scn.load(val.SCENARIOS / "default-1k.yaml")["raw"])
    raw.pop("sources")
    raw.pop("estimates")
    return raw


def _row(sc: dict, path: str) -> dict:
    return next(r for r in sc["input_sources"] if r["path"] == path)


def test_a_scenario_without_sources_names_what_is_unsourced_and_defaults_keep_theirs():
    sc = scn.validate(_bare())
    line = sources.summary(sc["input_sources"])
    assert "say nowhere where they come from: horizon_days, price_per_gpu_hour, cluster.nodes" in line, line
    assert _row(sc, "faults[faulty_gpu].rate_per_1000_node_days")["how"] == "unsourced"
    # an input the scenario does not write takes the simulator's default, and the default's source
    verify = _row(sc, "repair.verify_min")
    assert verify["how"] == "default" and verify["kind"] == "estimate" and verify["source"]["high"] == 30, verify
    assert _row(sc, "lemons.fraction")["how"] == "unsourced"  # written in the scenario: it must say
    assert _row(sc, "lemons.cure_probability")["how"] == "default"  # not written: the default's source
    assert _row(sc, "repair.technicians")["how"] == "default"


def test_the_most_specific_statement_wins():
    raw = _bare()
    raw["sources"] = [
        {"paths": ["faults"], "source": "a paper for every fault field"},
        {"paths": ["faults[*].rate_per_1000_node_days"], "source": {"kind": "paper", "cite": "Table 5"}},
        {"paths": ["faults[straggler].rate_per_1000_node_days"],
         "source": {"kind": "estimate", "low": 1, "high": 9, "why": "no source"}},
    ]
    raw["estimates"] = [{"path": "faults[straggler].visible", "low": 0, "high": 1, "source": "estimate; a guess"}]
    raw["faults"][0]["source"] = {"kind": "site", "count": 12, "exposure_node_days": 3000.0, "window": ["a", "b"]}
    raw["faults"][1]["source"] = {"kind": "base", "note": "no event in the records: the base rate is kept"}
    sc = scn.validate(raw)
    first, second = raw["faults"][0]["name"], raw["faults"][1]["name"]
    assert _row(sc, f"faults[{first}].rate_per_1000_node_days")["how"] == "fault"  # calibrate's own evidence
    rate = _row(sc, f"faults[{first}].rate_per_1000_node_days")
    assert "the site's own (count 12" in sources.describe(rate["source"])
    assert _row(sc, f"faults[{second}].rate_per_1000_node_days")["source"]["cite"] == "Table 5"  # base: falls through
    assert _row(sc, "faults[straggler].rate_per_1000_node_days")["source"]["high"] == 9  # longer path wins
    assert _row(sc, "faults[straggler].visible")["how"] == "estimates"
    assert _row(sc, f"faults[{first}].fixed_by")["source"]["cite"] == "a paper for every fault field"
    # a fault named by its index is the same fault
    raw["sources"].append({"paths": ["faults[0].fixed_by"], "source": {"kind": "site", "why": "our own runbook"}})
    assert _row(scn.validate(raw), f"faults[{first}].fixed_by")["kind"] == "site"


@pytest.mark.parametrize("bad, message", [
    ({"paths": "x"}, "sources: expected a list of {paths, source} mappings"),
    ([{"source": "x"}], "sources[0]: expected a mapping with paths (a list of input paths) and source"),
    ([{"paths": [], "source": "x"}], "sources[0].paths: expected a list of input paths"),
    ([{"paths": ["faults[*"], "source": "x"}], "sources[0].paths: 'faults[*' is not an input path"),
    ([{"paths": ["cluster"], "source": ""}], "sources[0].source: expected a citation (text) or a mapping with kind, "
                                             "got an empty string"),
    ([{"paths": ["cluster"], "source": {"kind": "guess"}}], "sources[0].source: expected a citation (text) or a "
                                                            "mapping with kind: one of paper, site, estimate, base"),
    ([{"paths": ["cluster"], "source": {"kind": "paper"}}], "sources[0].source.cite: a paper source names the paper"),
    ([{"paths": ["cluster"], "source": {"kind": "estimate", "why": "a guess"}}],
     "sources[0].source: an estimate says its plausible range (low and high), and why"),
])
def test_bad_sources_are_refused_by_field(bad, message):
    raw = _bare()
    raw["sources"] = bad
    with pytest.raises(SpecError) as e:
        scn.validate(raw)
    assert message in str(e.value), str(e.value)


def test_the_report_lists_every_input_with_its_source():
    sc = scn.load(val.SCENARIOS / "default-1k.yaml")
    text = report._sources_html({"input_sources": sc["input_sources"]})
    assert "<h2>Where the inputs come from</h2>" in text
    assert "Inputs: 103; 47 from papers, 12 the site&#x27;s own, 44 estimates with a plausible range" in text
    assert text.count("<tr><td><code>") == len(sc["input_sources"])
    assert "estimate, plausible 0 to 13: " in text  # the false-positive rate, from the estimates section
    assert report._sources_html({}) == ""
