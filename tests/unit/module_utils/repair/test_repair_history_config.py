"""The compact history (what lives in Slurm's node Extra/Comment field), the config validator and the classifier."""

from __future__ import annotations

import json

import pytest
from repair_builders import NOW, D, H, hist, report

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import (
    History,
    HistoryError,
    RepairConfig,
    RepairError,
    classify,
    dumps,
    is_ours,
    loads,
    parse_duration,
    record_outcome,
)

# Slurm keeps the node Extra/Comment as a free string; we keep ours far below any practical limit.
HISTORY_BUDGET = 512


def worst_case_history() -> str:
    """Everything the policy can accumulate before it escalates or retires the node."""
    steps = [("reset_gpu", NOW - 5000, "failed", NOW - 4990), ("reboot", NOW - 3000, "timeout", NOW - 2900),
             ("replace", NOW - 100, None)]
    return hist(
        cls="gpu_memory", code="row_remap_failure", steps=steps, spare="gpu-spare-rack12-07",
        repairs=[(NOW - k * H, "reboot") for k in range(8)],
        past=[(NOW - k * D, "gpu_lost") for k in range(1, 9)], cooldown=NOW + 1800, escalated=NOW, seq=99,
    )


def test_round_trip():
    text = hist(steps=[("reset_gpu", NOW - 600, "failed"), ("reboot", NOW - 60, None)], past=[(NOW - 3 * D, "nvlink")],
                cooldown=NOW + 10, spare="spare1")
    h = loads(text)
    assert dumps(h) == text
    assert h.incident.pending().action == "reboot"
    assert h.incident.tried("reset_gpu") and not h.incident.tried("replace")
    assert h.past == ((NOW - 3 * D, "nvlink"),)
    assert json.loads(text)["gf"] == 1


def test_history_is_compact():
    text = worst_case_history()
    assert len(text) < HISTORY_BUDGET, len(text)
    # a typical one (one incident, two steps) is much shorter
    typical = hist(steps=[("reset_gpu", NOW - 600, "failed"), ("reboot", NOW - 60, None)])
    assert len(typical) < 160, len(typical)
    assert "\n" not in text and " " not in text


def test_history_lists_are_capped():
    h = loads(hist(repairs=[(NOW - k * 60, "reboot") for k in range(100)],
                   past=[(NOW - k * 60, "gpu_lost") for k in range(100)]))
    h.prune(NOW, 30 * D)
    assert len(h.repairs) == 8 and len(h.past) == 8
    assert h.repairs[-1][0] == NOW  # newest kept


def test_prune_forgets_old_entries_and_expired_cooldown():
    h = loads(hist(repairs=[(NOW - 40 * D, "reboot"), (NOW - D, "reboot")], past=[(NOW - 40 * D, "nvlink")],
                   cooldown=NOW - 1))
    h.prune(NOW, 30 * D)
    assert h.repairs == ((NOW - D, "reboot"),) and h.past == () and h.cooldown_until is None


@pytest.mark.parametrize("action", ["reset_gpu", "reboot", "replace"])
def test_copies_share_nothing_a_change_reaches_and_started_is_copy_then_start(action):
    text = hist(steps=[("reset_gpu", NOW - 600, "failed")], past=[(NOW - 3 * D, "nvlink")], spare="spare1")
    h = loads(text)
    want = h.copy()
    want.start(action, NOW)
    got = h.started(action, NOW)
    assert got == want and got.incident.pending().action == action and got.repairs[-1] == (NOW, action)
    for c in (h.copy(), h.pruned(NOW, 30 * D), got):  # every change to a copy leaves the original as it was
        c.ran(NOW)
        c.finish("ok")
        c.start("reboot", NOW + 1)
        c.retract(c.incident.steps[-1])
        c.close(NOW + 2, 1800)
        c.prune(NOW + 3 * D, D)
        assert dumps(h) == text
    with pytest.raises(HistoryError):
        History().started(action, NOW)


RECORD_ROWS = [
    ("ok closes the incident and starts the cooldown", "ok", None, None, NOW + 1800),
    ("failed keeps it open", "failed", None, "failed", None),
    ("timeout keeps it open", "timeout", None, "timeout", None),
    ("ok without closing", "ok", False, "ok", None),
]


@pytest.mark.parametrize("name,outcome,close,left,cooldown", RECORD_ROWS, ids=[r[0] for r in RECORD_ROWS])
def test_record_outcome(name, outcome, close, left, cooldown):
    text = hist(steps=[("reset_gpu", NOW - 60, None)])
    h = loads(record_outcome(text, outcome, NOW, 1800, close=close))
    if left is None:
        assert h.incident is None and h.past[-1][1] == "gpu_memory"
    else:
        assert h.incident.steps[-1].outcome == left
    assert h.cooldown_until == cooldown


def test_record_outcome_rejects_bad_outcome():
    with pytest.raises(HistoryError, match="outcome"):
        record_outcome(hist(steps=[("reboot", NOW, None)]), "fine", NOW)


OURS_ROWS = [("", True), (None, True), ("   ", True), ('{"gf":1,"n":0}', True), ("rack 12", False),
             ('{"owner":"ops"}', False), ("[1,2]", False)]


@pytest.mark.parametrize("text,ours", OURS_ROWS)
def test_is_ours(text, ours):
    assert is_ours(text) is ours


BAD_HISTORY = [
    ("rack 12", "not JSON"),
    ('{"owner":"ops"}', "no 'gf' key"),
    ('{"gf":2}', "version"),
    ('{"gf":1,"i":{"id":1,"c":"zz","t":1}}', "malformed"),
    ('{"gf":1,"r":"bxyz"}', "expected a number"),
    ('{"gf":1,"r":[[1,"b"]]}', "comma-separated"),
]


@pytest.mark.parametrize("text,match", BAD_HISTORY)
def test_bad_history(text, match):
    with pytest.raises(HistoryError, match=match):
        loads(text)


def test_empty_history():
    assert loads("") == History()
    assert dumps(History()) == '{"gf":1,"n":0}'


# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------
def test_defaults_follow_the_published_anchors():
    c = RepairConfig.from_dict({})
    assert (c.ttl_s, c.cooldown_s) == (300, 1800)  # Together AI CompactTTL 5 min, cooldown ~30 min
    assert (c.max_attempts_per_incident, c.escalate_repairs, c.escalate_window_s) == (3, 5, 7 * D)  # NVSentinel
    assert (c.budget_attempts, c.budget_window_s) == (3, D)
    assert (c.breaker_fraction, c.breaker_window_s) == (0.5, 300)  # NVSentinel breaker
    assert c.max_unavailable.share == 0.2 and c.min_healthy == 0.51  # EKS 20 %, medik8s minHealthy 51 %
    assert c.ladder_for("gpu_lost") == ("reboot", "replace")  # no second reboot (gpud: 2 reboots then inspection)
    assert c.mode_for("gpu_memory") == "automatic"


def test_full_config_parses():
    c = RepairConfig.from_dict({
        "ttl": "2m", "cooldown": "1h", "budget": {"attempts": 2, "window": "12h"}, "max_attempts_per_incident": 4,
        "escalate": {"repairs": 3, "window": "3d"}, "lemon": {"incidents": 2, "window": "1w", "action": "escalate"},
        "ladders": {"gpu_lost": ["reboot", "reimage", "replace"]},
        "modes": {"default": "approval", "gpu_memory": "automatic"},
        "blast_radius": {"max_unavailable": 3, "min_healthy": 0.6, "domains": {"rack": 1, "switch": "50%"},
                         "max_parallel": 2},
        "breaker": {"enabled": True, "window": 600, "fraction": "30%", "min_nodes": 2},
        "spares": {"enabled": True, "on": ["replace"]}, "step_timeout": {"reboot": "20m"},
        "reason_prefix": "gpufleet:", "class_map": {"XID119": "software"}, "hook_actions": ["replace"],
        "resume_degraded": False, "history_keep": "60d",
    })
    assert c.ttl_s == 120 and c.cooldown_s == 3600 and c.budget_window_s == 12 * H and c.lemon_window_s == 7 * D
    assert c.mode_for("gpu_memory") == "automatic" and c.mode_for("nvlink") == "approval"
    assert c.max_unavailable.of(10) == 3 and c.domain_limits["switch"].of(4) == 2
    assert c.step_timeout_s["reboot"] == 1200 and c.step_timeout_s["reset_gpu"] == 600
    assert c.class_map == {"xid119": "software"}
    assert RepairConfig.from_dict(c.to_dict()) == c  # to_dict feeds from_dict


BAD_CONFIG = [
    ({"ttl": "soon"}, r"^ttl: expected a duration"),
    ({"ttl": -1}, r"^ttl: expected a duration >= 0"),
    ({"tll": 5}, r"unknown key\(s\) tll"),
    ({"budget": {"attempts": 0}}, r"^budget\.attempts: expected an integer >= 1"),
    ({"budget": {"attempts": True}}, r"^budget\.attempts"),
    ({"budget": []}, r"^budget: expected a mapping"),
    ({"ladders": {"gpu_lost": ["reboot", "pray"]}}, r"^ladders\.gpu_lost\[1\]: expected one of"),
    ({"ladders": {"gpu_lost": ["reboot", "reboot"]}}, r"appears twice"),
    ({"ladders": {"gpu_lost": []}}, r"^ladders\.gpu_lost: expected a non-empty list"),
    ({"ladders": {"disk": ["reboot"]}}, r"^ladders: unknown key\(s\) disk"),
    ({"modes": {"gpu_lost": "yolo"}}, r"^modes\.gpu_lost: expected one of automatic, approval, got 'yolo'"),
    ({"blast_radius": {"max_unavailable": 1.5}}, r"^blast_radius\.max_unavailable: expected a node count"),
    ({"blast_radius": {"max_unavailable": "150%"}}, r"^blast_radius\.max_unavailable: expected a fraction"),
    ({"blast_radius": {"min_healthy": 2}}, r"^blast_radius\.min_healthy: expected a fraction"),
    ({"blast_radius": {"domains": {"rack": "x"}}}, r"^blast_radius\.domains\.rack"),
    ({"breaker": {"enabled": "yes"}}, r"^breaker\.enabled: expected true or false"),
    ({"escalate": {"relapse": 1}}, r"^escalate\.relapse: expected true or false, got 1"),
    ({"spares": {"on": ["reboot"]}}, r"^spares\.on\[0\]"),
    ({"step_timeout": {"nap": 1}}, r"^step_timeout: unknown key"),
    ({"reason_prefix": ""}, r"^reason_prefix: expected a non-empty string"),
    ({"class_map": {"xid1": "cosmic"}}, r"^class_map\.xid1"),
    ({"lemon": {"action": "reboot"}}, r"^lemon\.action"),
    ("not a mapping", r"^repair config: expected a mapping"),
]


@pytest.mark.parametrize("data,match", BAD_CONFIG)
def test_bad_config_names_the_field(data, match):
    with pytest.raises(RepairError, match=match):
        RepairConfig.from_dict(data)


@pytest.mark.parametrize("value,seconds", [(5, 5), (2.5, 2.5), ("90s", 90), ("5m", 300), ("24h", 86400),
                                           ("7d", 604800), ("1w", 604800), (" 3 h ", 10800)])
def test_parse_duration(value, seconds):
    assert parse_duration(value, "x") == seconds


# ---------------------------------------------------------------------------------------------------------------
# Failure classes
# ---------------------------------------------------------------------------------------------------------------
CLASS_ROWS = [
    (report(code="xid48"), "gpu_memory"), (report(code="xid63"), "gpu_memory"), (report(code="xid64"), "gpu_memory"),
    (report(code="xid94"), "gpu_memory"), (report(code="xid95"), "gpu_memory"), (report(code="ecc_dbe"), "gpu_memory"),
    (report(code="row_remap_failure"), "gpu_memory"), (report(code="row_remap_pending"), "gpu_memory"),
    (report(code="retired_pages"), "gpu_memory"),
    (report(code="xid79"), "gpu_lost"), (report(code="gpu_lost"), "gpu_lost"), (report(code="gpu_count"), "gpu_lost"),
    (report(code="fallen_off_bus"), "gpu_lost"),
    (report(code="xid74"), "nvlink"), (report(code="nvlink_down"), "nvlink"), (report(code="fabric_manager"), "nvlink"),
    (report(code="xid145"), "nvlink"), (report(code="sxid"), "nvlink"),
    (report(code="thermal_slowdown"), "thermal"), (report(code="power_brake"), "thermal"),
    (report(code="xid54"), "thermal"), (report(code="clocks_event"), "thermal"),
    (report(code="driver_mismatch"), "software"), (report(code="xid13"), "software"),
    (report(code="persistence_off"), "software"),
    (report(code="probe_timeout"), "probe"), (report(code="nvml_timeout"), "probe"),
    (report(verdict="unknown", code=None, findings=[]), "probe"), (None, "probe"),
    (report(code="xid119"), "gpu"), (report(code="xid999"), "gpu"),
    (report(code="mystery"), "other"),
    # codes the health brain emits (plugins/module_utils/health/rules.py)
    (report(code="no_data", findings=[{"check": "probe", "severity": "unknown", "code": "no_data"}]), "probe"),
    (report(code="probe_timeout"), "probe"), (report(code="driver_not_loaded"), "software"),
    (report(code="nvml_missing"), "software"), (report(code="gpu_missing"), "gpu_lost"),
    (report(code="inforom_corrupted"), "gpu"), (report(code="recovery_action"), "gpu"),
    (report(code="reset_required"), "gpu"), (report(code="retired_pages"), "gpu_memory"),
    (report(code="sram_threshold"), "gpu_memory"), (report(code="fabric_state"), "nvlink"),
    (report(code="temp_shutdown"), "thermal"), (report(code="ib_down"), "other"),
    (report(code="memory_low"), "other"), (report(code="sxid12028"), "nvlink"),
    # no top code: the most severe finding decides
    ({"verdict": "unhealthy", "action": "reboot", "findings": [
        {"check": "temperature", "severity": "warn", "code": "temp_high"},
        {"check": "xid", "severity": "fail", "code": "xid79"}]}, "gpu_lost"),
]


@pytest.mark.parametrize("rep,cls", CLASS_ROWS, ids=[str((r or {}).get("code")) + "->" + c for r, c in CLASS_ROWS])
def test_classify(rep, cls):
    assert classify(rep) == cls


def test_class_map_overrides_table_by_prefix():
    assert classify(report(code="xid119"), {"xid119": "software"}) == "software"
    assert classify(report(code="nvlink_crc"), {"nvlink_c": "thermal"}) == "thermal"
    assert classify(report(code="nvlink_down"), {"nvlink_c": "thermal"}) == "nvlink"


def _reference_dumps(h: History) -> str:
    """The documented stored form, through json with sorted keys (what dumps() writes out by hand)."""
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import (
        MAX_CODE,
        OUTCOME_CODES,
        VERSION,
    )
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import ACTION_CODE, CLASS_CODE

    d: dict = {"gf": VERSION, "n": h.seq}
    inc = h.incident
    if inc is not None:
        i = {"id": inc.id, "c": CLASS_CODE[inc.failure_class], "k": inc.code[:MAX_CODE], "t": inc.first_seen,
             "s": [[ACTION_CODE[s.action], s.started, OUTCOME_CODES.get(s.outcome) if s.outcome else None]
                   + ([] if s.ran is None else [s.ran]) for s in inc.steps]}
        if inc.gpu is not None:
            i["g"] = inc.gpu
        if inc.escalated is not None:
            i["e"] = inc.escalated
        if inc.spare:
            i["sp"] = inc.spare
        if inc.hooks:
            i["hk"] = "".join(ACTION_CODE[a] for a in inc.hooks)
        d["i"] = i
    if h.repairs:
        d["r"] = ",".join(f"{ACTION_CODE[a]}{t}" for t, a in h.repairs)
    if h.past:
        d["p"] = ",".join(f"{CLASS_CODE[c]}{t}" for t, c in h.past)
    if h.cooldown_until is not None:
        d["cd"] = h.cooldown_until
    return json.dumps(d, separators=(",", ":"), sort_keys=True)


def test_dumps_is_the_sorted_json_form_for_any_history():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import Incident, Step
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.model import (
        CLASS_CODE,
        REPAIR_STEPS,
    )

    t = st.integers(min_value=0, max_value=4_000_000_000)
    step = st.builds(Step, st.sampled_from(REPAIR_STEPS), t,
                     st.sampled_from([None, "ok", "failed", "timeout", "unproven"]), st.none() | t)
    incident = st.builds(
        Incident, id=st.integers(0, 10**6), failure_class=st.sampled_from(sorted(CLASS_CODE)),
        code=st.text(max_size=40), gpu=st.none() | st.integers(0, 71), first_seen=t,
        steps=st.lists(step, max_size=5), escalated=st.none() | t, spare=st.none() | st.text(max_size=12),
        hooks=st.lists(st.sampled_from(["reimage", "replace"]), max_size=2))
    history = st.builds(
        History, seq=st.integers(0, 10**6), incident=st.none() | incident,
        repairs=st.lists(st.tuples(t, st.sampled_from(REPAIR_STEPS)), max_size=6),
        past=st.lists(st.tuples(t, st.sampled_from(sorted(CLASS_CODE))), max_size=6), cooldown_until=st.none() | t)

    @settings(max_examples=400, deadline=None)
    @given(history)
    def check(h):
        text = dumps(h)
        assert text == _reference_dumps(h)
        assert dumps(loads(text)) == text
        assert dumps(h.copy()) == text

    check()


def test_a_step_carries_its_proof_that_it_ran():
    """A reset's own record that it ran: kept by every later change of the step, read back as written, and the
    first proof wins; an older history (three-element steps) reads as before."""
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import record_outcome, record_ran

    text = hist(steps=[("reset_gpu", NOW - 60, None)])
    assert loads(text).incident.steps[-1].ran is None
    ran = record_ran(text, NOW - 50)
    assert f'["g",{NOW - 60},null,{NOW - 50}]' in ran
    assert record_ran(ran, NOW) == ran  # the first proof stays
    done = record_outcome(ran, "failed", NOW, close=False)
    step = loads(done).incident.steps[-1]
    assert (step.outcome, step.ran) == ("failed", NOW - 50)
    assert loads(record_outcome(text, "unproven", NOW, close=False)).incident.steps[-1].outcome == "unproven"
    assert record_ran(hist(open_incident=False), NOW) == hist(open_incident=False)  # nothing pending: unchanged
    with pytest.raises(HistoryError, match=r"i\.s: expected \[action, started, outcome\(, ran\)\]"):
        loads('{"gf":1,"i":{"c":"gm","id":1,"k":"x","s":[["g",1,null,2,3]],"t":1},"n":1}')
