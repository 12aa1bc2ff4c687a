"""gpufleet-sim calibrate --prometheus: the agent's series (verdict, findings, Xid counters) read back as node events.

The simulator's own runs are the ground truth: ``run --export-history`` writes the agent's reports as the series a
Prometheus would keep (``series.jsonl``), and the unhealthy episodes read from them are the agent's drains, class by
class, as Slurm's events show them. The HTTP client is checked against a loopback server that answers as Prometheus
does (the monitoring lane reads a real Prometheus: tests/integration/monitoring/test_calibrate_prometheus.py).
Hostile answers are refused naming the line or query and the field.
"""
import io
import json
import subprocess
import sys
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import metrics
from gpufleet_sim import calibrate as cal
from gpufleet_sim import prom_records as pr
from gpufleet_sim import scenario as scn
from gpufleet_sim.brain import default_brain
from gpufleet_sim.engine import Sim
from gpufleet_sim.export import events_text, series_jsonl
from gpufleet_sim.policies import resolve
from support.loopback_http import LoopbackJSON

TRUTH = Path(__file__).resolve().parents[2] / "fixtures" / "simulator" / "calibration-truth.yaml"
SIMDIR = Path(__file__).resolve().parents[3] / "simulator"


def _sim(sc, seed):
    sim = Sim(sc, resolve("passive+auto-repair+hot-spares"), seed, default_brain(sc))
    sim.keep_records(histories=False)
    sim.run()
    return sim


@pytest.fixture(scope="module")
def truth():
    sc = scn.load(TRUTH)
    return sc, default_brain(sc), {f["name"]: f["per_node_h"] * 24000 for f in sc["faults"]}


def _series(*items):
    return pr.read_series_file(io.StringIO("".join(json.dumps(x) + "\n" for x in items)), "series")


def _verdict(node, values):
    return {"metric": {"__name__": metrics.VERDICT_METRIC, "node": node, "verdict": "unhealthy"},
            "values": [[t, str(v)] for t, v in values]}


def _finding(node, code, t, severity="critical", action="reboot", gpu="1"):
    return {"metric": {"__name__": metrics.FINDING_METRIC, "node": node, "check": "kmsg", "code": code, "gpu": gpu,
                       "severity": severity, "action": action}, "values": [[t, "1"]]}


def test_the_agents_episodes_are_its_drains_class_by_class(truth):
    """One exported run: each unhealthy episode starts when Slurm's drain does, with the same class."""
    sc, _brain, _rates = truth
    sim = _sim(sc, 1)
    episodes = pr.episodes(pr.read_series_file(io.StringIO(series_jsonl(sim.vslurm.report_log)), "series"))
    events = cal.episodes(cal.read_events(events_text(sim.vslurm.events).splitlines(), "events"))
    drains = [e for e in events if e.reason.startswith("gpufleet:")]
    assert Counter(cal.event_key(e.reason) for e in episodes) == Counter(cal.event_key(e.reason) for e in drains)
    assert {(e.node, e.start) for e in episodes} == {(e.node, e.start) for e in drains}
    assert len(drains) > 50  # the run has enough of them to mean something


@pytest.mark.slow  # 20 seeds of 120 days: make unit, not make check
def test_calibrating_the_agents_series_alone_recovers_the_true_rates(truth):
    """A site without slurmdbd: the agent's episodes are the events. Share of seeds whose 95 % interval holds the
    scenario's rate, per class the agent can see (printed: the figure)."""
    sc, brain, rates = truth
    hits: dict = {}
    for seed in range(1, 21):
        sim = _sim(sc, seed)
        series = pr.read_series_file(io.StringIO(series_jsonl(sim.vslurm.report_log)), "series")
        events = pr.episodes(series)
        times = [t for s in series for t, _x in s.values]
        res = cal.fit(sc, brain, events, cal.Runs(), min(times), max(times) + 1)
        assert not res["unmatched"], res["unmatched"]
        for key in ("xid79", "xid48"):
            g = res["groups"][key]
            true = sum(rates[n] for n in g["classes"])
            hits.setdefault(key, []).append(g["ci95"][0] <= true <= g["ci95"][1])
    cover = {k: sum(v) / len(v) for k, v in hits.items()}
    print("coverage of the 95 % intervals from the agent's series alone, 20 seeds:", cover)
    assert all(c >= 0.85 for c in cover.values()), cover


def test_an_episode_runs_from_the_first_unhealthy_sample_to_the_first_that_is_not():
    series = _series(
        _verdict("n1", [(100, 0), (160, 1), (220, 1), (400, 1), (460, 0), (520, 1)]),  # a gap (280-340) ends nothing
        _finding("n1", "xid79", 160), _finding("n1", "xid48", 160, severity="warning", action="reset_gpu"),
        _finding("n1", "xid48", 520, action="reset_gpu", gpu=""),
        _verdict("n2", [(100, 0), (160, 0)]))
    got = pr.episodes(series)
    assert [(e.node, e.start, e.end, cal.event_key(e.reason)) for e in got] == [
        ("n1", 160.0, 460.0, "xid79"),  # the worst finding of the report names it, as the agent's drain reason does
        ("n1", 520.0, None, "xid48")]  # still open at the end
    assert got[0].reason == "gpufleet: xid79 gpu1"


def test_a_drain_request_without_an_unhealthy_verdict_is_an_episode_too():
    series = _series({"metric": {"__name__": metrics.DRAIN_METRIC, "node": "n1"},
                      "values": [[10, "0"], [70, "1"], [130, "0"]]},
                     _finding("n1", "hw_slowdown", 70, severity="warning", action="none", gpu=""))
    assert [(e.start, e.end, cal.event_key(e.reason)) for e in pr.episodes(series)] == [(70.0, 130.0, "hw_slowdown")]


def test_xid_counters_count_increases_resets_and_counters_born_in_the_window():
    def xid(code, values):
        return {"metric": {"__name__": metrics.XID_METRIC, "node": "n1", "gpu": "0", "xid": code},
                "values": [[t, str(v)] for t, v in values]}
    series = _series(xid("79", [(0, 5), (60, 5), (120, 7), (180, 1), (240, 2)]),  # +2, a reset (+1), +1
                     xid("48", [(600, 1), (660, 1)]))  # first seen well after the start: its first line counts
    assert pr.xid_counts(series, 0, 1000, grace=120) == {"79": 4.0, "48": 1.0}
    assert pr.xid_counts(series, 0, 100, grace=120) == {}  # nothing rose before 100


# ---- hostile answers -------------------------------------------------------------------------------------------------
GOOD = {"status": "success", "data": {"resultType": "matrix", "result": [_verdict("n1", [(1.5, 1), (61.5, 0)])]}}


@pytest.mark.parametrize("line, match", [
    ("{not json", r"series: line 2: not JSON"),
    (json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}), r"answered 'error'.*parse"),
    (json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}), r"resultType matrix"),
    (json.dumps({"metric": {"__name__": "x"}, "values": {"a": 1}}), r"values: expected a list"),
    (json.dumps({"metric": {"__name__": "x"}, "values": [[2, "1"], [1, "1"]]}), r"values\[1\]: expected times that"),
    (json.dumps({"metric": {"__name__": "x"}, "values": [[1, "one"]]}), r"values\[0\]: expected a number as text"),
    (json.dumps({"metric": {"__name__": "x"}, "values": [[1, 1]]}), r"values\[0\]: expected \[time"),
    (json.dumps({"metric": {"__name__": "x"}, "values": [[True, "1"]]}), r"values\[0\]: expected \[time"),
    (json.dumps({"metric": {"node": "n1"}, "values": []}), r"no __name__"),
    (json.dumps({"metric": {"__name__": "x", "node": "n" * 300}, "values": []}), r"labels as short text"),
    (json.dumps({"metric": ["x"], "values": []}), r"metric: expected a mapping"),
    (json.dumps([1, 2]), r"expected a range series"),
])
def test_hostile_series_are_refused_by_line_and_field(line, match):
    with pytest.raises(pr.PromError, match=match):
        pr.read_series_file(io.StringIO(json.dumps(GOOD) + "\n" + line + "\n"), "series")


def test_a_genuine_answer_is_read():
    (s,) = pr.read_series_file(io.StringIO(json.dumps(GOOD) + "\n\n"), "series")
    want = (metrics.VERDICT_METRIC, {"node": "n1", "verdict": "unhealthy"}, [(1.5, 1.0), (61.5, 0.0)])
    assert (s.name, s.labels, s.values) == want


# ---- the HTTP API ----------------------------------------------------------------------------------------------------
def _answer(path, _headers):
    """query_range as Prometheus answers it: the samples of one series at each step inside [start, end]."""
    url = urllib.parse.urlsplit(path)
    q = dict(urllib.parse.parse_qsl(url.query))
    if url.path != "/api/v1/query_range" or q["query"] == "bad(":
        return 400, json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 5"})
    start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
    values = [[start + i * step, "1"] for i in range(int((end - start) // step) + 1)]
    return 200, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": metrics.VERDICT_METRIC, "node": "n1", "verdict": "unhealthy"}, "values": values}]}})


@pytest.fixture
def prom():
    server = LoopbackJSON(_answer)
    yield server
    server.close()


def _asked(server):
    return [dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query)) for path, _h in server.requests]


def test_a_long_window_is_asked_in_pieces_prometheus_accepts_and_joined(prom):
    step = 60.0
    end = step * (pr.MAX_POINTS * 2 + 5)
    (s,) = pr.query_range(prom.url, "q", 0.0, end, step)
    asked = _asked(prom)
    assert len(asked) == 3
    assert all((float(q["end"]) - float(q["start"])) / step < pr.MAX_POINTS for q in asked)
    times = [t for t, _x in s.values]
    assert times == sorted(set(times)) and times[0] == 0.0 and times[-1] == end  # every step once, no seam
    assert len(times) == int(end / step) + 1


def test_the_servers_own_error_is_shown(prom):
    with pytest.raises(pr.PromError, match=r"bad\(.*answered 'error': parse error at char 5"):
        pr.query_range(prom.url, "bad(", 0, 60, 60)


def test_a_server_that_is_not_there_and_a_url_that_is_not_one_are_named():
    with pytest.raises(pr.PromError, match="cannot reach the server"):
        pr.query_range("http://127.0.0.1:9", "q", 0, 60, 60, timeout=5)
    with pytest.raises(pr.PromError, match=r"--prometheus: expected the server's URL"):
        pr.query_range("file:///etc/passwd", "q", 0, 60, 60)


# ---- the command -----------------------------------------------------------------------------------------------------
def _cli(*args, cwd=SIMDIR):
    return subprocess.run([sys.executable, "-m", "gpufleet_sim.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, check=False, cwd=cwd)


@pytest.mark.slow  # a simulated run and a calibration, each a fresh interpreter: make unit, not make check
def test_cli_calibrates_from_an_exported_series_file_alone(tmp_path):
    r = _cli("run", TRUTH, "--seeds", "1", "--policy", "passive+auto-repair+hot-spares", "--no-sensitivity",
             "--export-history", tmp_path / "hist")
    assert r.returncode == 0, r.stderr
    (series,) = (tmp_path / "hist").glob("*/seed-1/series.jsonl")
    r = _cli("calibrate", TRUTH, "--prometheus-file", series, "--out", tmp_path / "site.yaml", "--json",
             tmp_path / "fit.json")
    assert r.returncode == 0, r.stdout + r.stderr
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert fit["groups"]["xid79"]["count"] > 0 and fit["groups"]["Not responding"]["count"] == 0
    assert fit["agent"]["episodes"]["xid79"] == fit["groups"]["xid79"]["count"]
    assert "the agent's series" in r.stdout
    doc = yaml.safe_load((tmp_path / "site.yaml").read_text())
    src = {f["name"]: f.get("source", {}) for f in doc["faults"]}
    assert any(s.get("kind") == "site" and s.get("key") == "xid79" for s in src.values()), src


def test_cli_refuses_what_it_cannot_use(tmp_path, prom):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"status": "success", "data": {"resultType": "vector", "result": []}}\n')
    r = _cli("calibrate", TRUTH, "--prometheus-file", bad)
    assert r.returncode == 2 and "line 1: expected data.resultType matrix" in r.stderr and not r.stdout.strip()
    r = _cli("calibrate", TRUTH, "--prometheus", prom.url)
    assert r.returncode == 2 and "--since" in r.stderr
    r = _cli("calibrate", TRUTH, "--prometheus", prom.url, "--prometheus-file", bad)
    assert r.returncode == 2 and "give one of them" in r.stderr
    r = _cli("calibrate", TRUTH, "--prometheus", prom.url, "--since", "2026-01-02T00:00:00", "--until",
             "2026-01-01T00:00:00")
    assert r.returncode == 2 and "--until: expected a time after --since" in r.stderr


def _checks(node, starts, took, scrape=15.0):
    """The agent's last-run and check-duration gauges as Prometheus scrapes them every ``scrape`` seconds."""
    times, last, dur = [], [], []
    t, i = starts[0], 0
    while t < starts[-1] + 100:
        while i + 1 < len(starts) and starts[i + 1] + took[i + 1] <= t:
            i += 1
        times.append(t)
        last.append(starts[i])
        dur.append(took[i])
        t += scrape
    return [{"metric": {"__name__": metrics.LAST_RUN_METRIC, "node": node},
             "values": [[a, str(b)] for a, b in zip(times, last)]},
            {"metric": {"__name__": metrics.DURATION_METRIC, "node": node},
             "values": [[a, str(b)] for a, b in zip(times, dur)]}]


def test_the_time_to_detect_is_the_check_interval_and_the_checks_run_time():
    starts = [1000.0 + 300 * i for i in range(12)] + [1000.0 + 300 * 11 + 86400]  # every 5 min; then a day away
    took = [20.0 + (i % 4) * 10 for i in range(len(starts))]  # 20-50 s
    got = pr.detection(_series(*_checks("n1", starts, took), *_checks("n2", starts[:3], took[:3])), 0, 1e9)
    assert got["checks"] == 13 + 3
    assert got["interval_min"] == pytest.approx(5.0)  # the day away is a node out of service, not its timer
    assert got["duration_min"]["median"] == pytest.approx(30 / 60)  # 16 checks: five of 20 s, four each of 30, 40
    assert got["duration_min"]["p90"] == pytest.approx(50 / 60)
    few = pr.detection(_series(*_checks("n1", starts[:3], took[:3])), 0, 1e9)
    assert few == {"checks": 3, "interval_min": None, "duration_min": None}  # too few to say


def test_the_site_s_detection_is_written_with_its_source():
    raw = {"repair": {"check_interval_min": 5}, "estimates": [{"path": "repair.check_detect_min", "low": 0.1,
                                                               "high": 5, "source": "estimate"}]}
    pr.calibrated_detection(raw, {"checks": 40, "interval_min": 2.0, "duration_min": {"median": 0.5, "p90": 0.8}},
                            ["2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"])
    assert raw["repair"]["check_interval_min"] == 2.0
    assert raw["repair"]["check_detect_min"] == {"dist": "lognormal", "median": 0.5, "p90": 0.8}
    assert [e["paths"] for e in raw["sources"]] == [["repair.check_interval_min"], ["repair.check_detect_min"]]
    assert all(e["source"]["kind"] == "site" and e["source"]["count"] == 40 for e in raw["sources"])
    assert raw["estimates"] == []  # no longer a guess
    untouched = {"repair": {"check_interval_min": 5}}
    pr.calibrated_detection(untouched, {"checks": 2, "interval_min": None, "duration_min": None}, [])
    assert untouched == {"repair": {"check_interval_min": 5}}
