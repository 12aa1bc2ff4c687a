# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Table of rules.py: one row per threshold side (just below -> no finding, at/above -> the finding), N/A (None)
values -> no finding, and the GPU model profiles (profiles.py) by name.

A row is (id, snapshot, config, previous snapshot or None, expected). A previous snapshot is judged first, 60 s
earlier, and its state carried, for the rules that judge rates. ``expected`` is ``(verdict, action, code, severity,
gpu)``: exactly one finding with that code, with that severity, action and GPU, and the report's verdict and
strongest action as given; or ``ABSENT + code``: no finding with that code and a healthy node (the base snapshot
is healthy, so a row that fires anything fails).
"""
from __future__ import annotations

import pytest
from health_fixtures import h100, node

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import (
    Finding,
    NvLinkInfo,
    Snapshot,
    judge,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.model import Disk
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.profiles import PROFILES, profile_for

NOW = 1_000_000.0
ABSENT = "absent:"


def no(code):
    return ABSENT + code


def one(gpu=0, **kw):
    """A one-GPU node whose GPU 0 differs from a healthy H100 by ``kw``."""
    return node(h100(gpu, **kw))


def links(link7=None, **kw):
    """18 active links with counters ``kw``; link 7 with ``link7`` instead, when given."""
    return [NvLinkInfo(i, active=True, **(link7 if link7 is not None and i == 7 else kw)) for i in range(18)]


# ---------------------------------------------------------------------------------------------------------- rules
# temperature: absolute thresholds (shutdown-2 -> critical, slowdown -> warning) when the driver gives them; T.Limit
# margin <= 0 (R535+); 93 C absolute when there is neither; HBM at its max.
NO_TLIMIT = dict(temp_tlimit=None)
TEMP_ROWS = [
    ("temp_shutdown below shutdown-2", one(temperature=89, temp_shutdown=92, temp_slowdown=None, **NO_TLIMIT), None,
     None, no("temp_shutdown")),
    ("temp_shutdown at shutdown-2", one(temperature=90, temp_shutdown=92, temp_slowdown=None, **NO_TLIMIT), None,
     None, ("unhealthy", "monitor", "temp_shutdown", "critical", 0)),
    ("temp_shutdown above", one(3, temperature=97, temp_shutdown=92, temp_slowdown=87, **NO_TLIMIT), None, None,
     ("unhealthy", "monitor", "temp_shutdown", "critical", 3)),
    ("temp_slowdown below", one(temperature=86, temp_slowdown=87, temp_shutdown=92, **NO_TLIMIT), None, None,
     no("temp_slowdown")),
    ("temp_slowdown at", one(temperature=87, temp_slowdown=87, temp_shutdown=92, **NO_TLIMIT), None, None,
     ("degraded", "monitor", "temp_slowdown", "warning", 0)),
    ("temp_tlimit margin 1 C", one(temp_tlimit=1), None, None, no("temp_tlimit")),
    ("temp_tlimit margin 0 C", one(temp_tlimit=0), None, None, ("degraded", "monitor", "temp_tlimit", "warning", 0)),
    ("temp_tlimit past the limit", one(temp_tlimit=-4), None, None,
     ("degraded", "monitor", "temp_tlimit", "warning", 0)),
    ("temp_high below 93 C", one(temperature=92.9, **NO_TLIMIT), None, None, no("temp_high")),
    ("temp_high at 93 C", one(temperature=93, **NO_TLIMIT), None, None,
     ("degraded", "monitor", "temp_high", "warning", 0)),
    ("temp_high N/A temperature", one(temperature=None, **NO_TLIMIT), None, None, no("temp_high")),
    ("temp N/A with thresholds", one(temperature=None, temp_slowdown=87, temp_shutdown=92, **NO_TLIMIT), None, None,
     no("temp_slowdown")),
    ("temp_high not used when T.Limit is given", one(temperature=95, temp_tlimit=5), None, None, no("temp_high")),
    ("memory_temp below max", one(memory_temperature=94, memory_temp_max=95), None, None, no("memory_temp")),
    ("memory_temp at max", one(memory_temperature=95, memory_temp_max=95), None, None,
     ("degraded", "monitor", "memory_temp", "warning", 0)),
    ("memory_temp N/A max", one(memory_temperature=120, memory_temp_max=None), None, None, no("memory_temp")),
]

# power: draw > limit + 5 %; enforced limit below the default by more than 2 %.
POWER_ROWS = [
    ("power_over_limit at limit+5%", one(power_draw=735), None, None, no("power_over_limit")),
    ("power_over_limit above limit+5%", one(power_draw=735.5), None, None,
     ("degraded", "monitor", "power_over_limit", "warning", 0)),
    ("power_over_limit N/A draw", one(power_draw=None), None, None, no("power_over_limit")),
    ("power_over_limit N/A limit", one(power_draw=900, power_limit=None), None, None, no("power_over_limit")),
    ("power_capped at default-2%", one(power_limit=686), None, None, no("power_capped")),
    ("power_capped below default-2%", one(5, power_limit=685.9), None, None,
     ("degraded", "monitor", "power_capped", "warning", 5)),
    ("power_capped N/A limit", one(power_limit=None), None, None, no("power_capped")),
]

# persistence off: info (healthy) by default, warning with require_persistence.
PERSISTENCE_ROWS = [
    ("persistence_off info", one(persistence_mode=False), None, None,
     ("healthy", "none", "persistence_off", "info", 0)),
    ("persistence_off required", one(persistence_mode=False), {"require_persistence": True}, None,
     ("degraded", "monitor", "persistence_off", "warning", 0)),
    ("persistence on", one(persistence_mode=True), {"require_persistence": True}, None, no("persistence_off")),
    ("persistence N/A", one(persistence_mode=None), {"require_persistence": True}, None, no("persistence_off")),
]

# driver / CUDA drift against the expected versions (node-level: gpu None).
DRIVER_ROWS = [
    ("driver as expected", node(h100(0)), {"expected_driver": "580.105.08"}, None, no("driver_drift")),
    ("driver_drift", node(h100(0)), {"expected_driver": "580.95.05"}, None,
     ("degraded", "reimage", "driver_drift", "warning", None)),
    ("driver N/A", Snapshot(gpus=[h100(0)], driver_version=None),
     {"expected_driver": "580.95.05"}, None, no("driver_drift")),
    ("cuda as expected", node(h100(0), cuda_version="13.0"), {"expected_cuda": "13.0"}, None, no("cuda_drift")),
    ("cuda_drift", node(h100(0), cuda_version="12.8"), {"expected_cuda": "13.0"}, None,
     ("degraded", "reimage", "cuda_drift", "warning", None)),
    ("cuda N/A", node(h100(0)), {"expected_cuda": "13.0"}, None, no("cuda_drift")),
]

# retired pages (pre-Ampere style counters, still read where present): pending -> reset; > 62 total or > 15 DBE ->
# replace.
RETIRED_ROWS = [
    ("retired_pages_pending", one(2, retired_pages_pending=True), None, None,
     ("unhealthy", "reset_gpu", "retired_pages_pending", "critical", 2)),
    ("retired_pages not pending", one(retired_pages_pending=False), None, None, no("retired_pages_pending")),
    ("retired_pages_pending N/A", one(retired_pages_pending=None), None, None, no("retired_pages_pending")),
    ("retired_pages_limit 62 total", one(retired_pages_sbe=50, retired_pages_dbe=12), None, None,
     no("retired_pages_limit")),
    ("retired_pages_limit 63 total", one(retired_pages_sbe=51, retired_pages_dbe=12), None, None,
     ("unhealthy", "replace", "retired_pages_limit", "critical", 0)),
    ("retired_pages_limit 15 DBE", one(retired_pages_sbe=0, retired_pages_dbe=15), None, None,
     no("retired_pages_limit")),
    ("retired_pages_limit 16 DBE", one(1, retired_pages_sbe=0, retired_pages_dbe=16), None, None,
     ("unhealthy", "replace", "retired_pages_limit", "critical", 1)),
    ("retired_pages N/A counts", one(retired_pages_sbe=None, retired_pages_dbe=None), None, None,
     no("retired_pages_limit")),
]

# ECC mode.
ECC_ROWS = [
    ("ecc_disabled", one(4, ecc_enabled=False, ecc_pending_enabled=False), None, None,
     ("degraded", "monitor", "ecc_disabled", "warning", 4)),
    ("ecc enabled", one(ecc_enabled=True, ecc_pending_enabled=True), None, None, no("ecc_disabled")),
    ("ecc N/A", one(ecc_enabled=None, ecc_pending_enabled=None), None, None, no("ecc_disabled")),
    ("ecc_disabled where the profile does not expect ECC", one(ecc_enabled=False, ecc_pending_enabled=False),
     {"profiles": {"H100": {"ecc_expected": False}}}, None, no("ecc_disabled")),
]

# NVLink CRC errors as a rate between runs (60 s apart): > 100/s -> reset.
NVLINK_ROWS = [
    ("nvlink_crc 100/s", one(nvlinks=links({"crc_flit_errors": 6000}, crc_flit_errors=0)), None,
     one(nvlinks=links(crc_flit_errors=0)), no("nvlink_crc")),
    ("nvlink_crc above 100/s", one(nvlinks=links({"crc_data_errors": 6001}, crc_data_errors=0)), None,
     one(nvlinks=links(crc_data_errors=0)), ("unhealthy", "reset_gpu", "nvlink_crc", "critical", 0)),
    ("nvlink_crc no previous run", one(nvlinks=links(crc_flit_errors=10 ** 9)), None, None, no("nvlink_crc")),
    ("nvlink_crc N/A counters", one(nvlinks=links(crc_flit_errors=None)), None,
     one(nvlinks=links(crc_flit_errors=None)), no("nvlink_crc")),
    ("nvlink_crc counter reset", one(nvlinks=links(crc_flit_errors=0)), None,
     one(nvlinks=links(crc_flit_errors=10 ** 6)), no("nvlink_crc")),
]

# disk and host memory free below 5 % (node-level).
GB = 10 ** 9
NODE_ROWS = [
    ("disk_full 5% free", node(h100(0), disks=[Disk("/", total_bytes=100 * GB, free_bytes=5 * GB)]), None, None,
     no("disk_full")),
    ("disk_full below 5% free", node(h100(0), disks=[Disk("/", total_bytes=100 * GB, free_bytes=5 * GB - 1)]),
     None, None, ("degraded", "monitor", "disk_full", "warning", None)),
    ("disk N/A total", node(h100(0), disks=[Disk("/", total_bytes=None, free_bytes=0)]), None, None,
     no("disk_full")),
    ("disk N/A free", node(h100(0), disks=[Disk("/", total_bytes=100 * GB, free_bytes=None)]), None, None,
     no("disk_full")),
    ("memory_low 5% available", node(h100(0), memory_total_bytes=100 * GB, memory_available_bytes=5 * GB), None,
     None, no("memory_low")),
    ("memory_low below 5%", node(h100(0), memory_total_bytes=100 * GB, memory_available_bytes=5 * GB - 1), None,
     None, ("degraded", "monitor", "memory_low", "warning", None)),
    ("memory N/A", node(h100(0), memory_total_bytes=100 * GB, memory_available_bytes=None), None, None,
     no("memory_low")),
]

# GPU count against expected_gpus (config) or the source's attached count.
COUNT_ROWS = [
    ("gpu count as expected", node(*[h100(i) for i in range(8)]), {"expected_gpus": 8}, None, no("gpu_missing")),
    ("gpu_missing 7 of 8", node(*[h100(i) for i in range(7)]), {"expected_gpus": 8}, None,
     ("unhealthy", "reboot", "gpu_missing", "critical", None)),
    ("gpu_missing from attached count", node(*[h100(i) for i in range(7)], attached_gpus=8), None, None,
     ("unhealthy", "reboot", "gpu_missing", "critical", None)),
    ("gpu_count_mismatch 9 of 8", node(*[h100(i) for i in range(9)]), {"expected_gpus": 8}, None,
     ("degraded", "monitor", "gpu_count_mismatch", "warning", None)),
    ("gpu count N/A expected", node(*[h100(i) for i in range(7)]), None, None, no("gpu_missing")),
]

# ---------------------------------------------------------------------------------------------------- profiles
# name as the driver reports it -> (profile key, PCIe gen, x width, NVLinks, default power W)
MODELS = {
    "NVIDIA A100-SXM4-40GB": ("A100", 4, 16, 12, 400),
    "NVIDIA H100 80GB HBM3": ("H100", 5, 16, 18, 700),
    "NVIDIA H200": ("H200", 5, 16, 18, 700),
    "NVIDIA B200": ("B200", 6, 16, 18, 1000),
    "NVIDIA GB200": ("GB200", 6, 16, 18, 1200),
}
REPLAY_LIMIT = {4: 16, 5: 31, 6: 62}  # replays per minute at x16 per generation (DEFAULT_THRESHOLDS)


def model(name, index=0, **kw):
    """A GPU of that model whose default power limit and PCIe generation are N/A, so the rules take them from the
    model's profile."""
    base = dict(name=name, power_default_limit=None, power_limit=MODELS.get(name, (0, 0, 0, 0, None))[4],
                pcie_gen_current=None, pcie_gen_max=None, pcie_width_current=None, pcie_width_max=None)
    base.update(kw)
    return node(h100(index, **base))


PROFILE_ROWS = []
for _name, (_key, _gen, _width, _links, _watts) in MODELS.items():
    _capped = int(_watts * 0.98)  # the profile's default - 2 %: not capped; 0.1 W less: capped
    _limit = REPLAY_LIMIT[_gen]
    PROFILE_ROWS += [
        (f"{_key} power at profile default-2%", model(_name, power_limit=_capped), None, None, no("power_capped")),
        (f"{_key} power_capped below profile default-2%", model(_name, 1, power_limit=_capped - 0.1), None, None,
         ("degraded", "monitor", "power_capped", "warning", 1)),
        (f"{_key} pcie_replay at Gen{_gen} limit", model(_name, pcie_replay_counter=100 + _limit), None,
         model(_name, pcie_replay_counter=100), no("pcie_replay")),
        (f"{_key} pcie_replay above Gen{_gen} limit", model(_name, pcie_replay_counter=100 + _limit + 1), None,
         model(_name, pcie_replay_counter=100), ("degraded", "monitor", "pcie_replay", "warning", 0)),
    ]
PROFILE_ROWS += [
    # the H200 is judged by its own profile, not H100's: a site that runs its H200s at 1000 W sees a 700 W H200 as
    # capped, while an H100 at 700 W (H100 profile untouched) is fine
    ("H200 own profile: 700 W capped at a 1000 W default", model("NVIDIA H200", 2, power_limit=700),
     {"profiles": {"H200": {"power_default_w": 1000}}}, None, ("degraded", "monitor", "power_capped", "warning", 2)),
    ("H100 not judged by the H200 profile", model("NVIDIA H100 80GB HBM3", power_limit=700),
     {"profiles": {"H200": {"power_default_w": 1000}}}, None, no("power_capped")),
    # GB200 is matched before B200: a 1000 W GB200 is capped (its default is 1200 W), a 1000 W B200 is not
    ("GB200 at the B200 default is capped", model("NVIDIA GB200", power_limit=1000), None, None,
     ("degraded", "monitor", "power_capped", "warning", 0)),
    ("B200 at its default", model("NVIDIA B200", power_limit=1000), None, None, no("power_capped")),
    # a profile with no NVLink: inactive links are not a failure there; with NVLinks they are
    ("nvlink_down where the profile has NVLinks", one(nvlinks=[NvLinkInfo(0, active=False)]), None, None,
     ("unhealthy", "reset_gpu", "nvlink_down", "critical", 0)),
    ("nvlink_down where the profile has none", one(nvlinks=[NvLinkInfo(0, active=False)]),
     {"profiles": {"H100": {"nvlinks": 0}}}, None, no("nvlink_down")),
    # unknown model, default limit N/A: nothing to compare the enforced limit with
    ("unknown model power N/A default", model("NVIDIA L40S", power_limit=100), None, None, no("power_capped")),
    # forced profile (config profile: A100) applies A100's Gen4 replay limit to whatever the name says
    ("forced A100 profile Gen4 limit", model("NVIDIA H100 80GB HBM3", pcie_replay_counter=100 + 17),
     {"profile": "A100"}, model("NVIDIA H100 80GB HBM3", pcie_replay_counter=100),
     ("degraded", "monitor", "pcie_replay", "warning", 0)),
]

ROWS = (TEMP_ROWS + POWER_ROWS + PERSISTENCE_ROWS + DRIVER_ROWS + RETIRED_ROWS + ECC_ROWS + NVLINK_ROWS + NODE_ROWS +
        COUNT_ROWS + PROFILE_ROWS)


def run(snap, cfg, prev):
    state = None
    if prev is not None:
        state = judge(prev, (), config=cfg, now=NOW - 60).state
    return judge(snap, (), config=cfg, state=state, now=NOW)


@pytest.mark.parametrize("name,snap,cfg,prev,expected", ROWS, ids=[r[0] for r in ROWS])
def test_rule_row(name, snap, cfg, prev, expected):
    r = run(snap, cfg, prev)
    if isinstance(expected, str):
        code = expected[len(ABSENT):]
        assert code not in [f.code for f in r.findings], r.summary
        assert r.verdict == "healthy" and r.action == "none", r.summary
        assert not [f for f in r.findings if f.severity != "info"], r.summary
        return
    verdict, action, code, severity, gpu = expected
    hits = [f for f in r.findings if f.code == code]
    assert len(hits) == 1, [f.to_dict() for f in r.findings]
    f = hits[0]
    assert (f.severity, f.action, f.gpu) == (severity, action, gpu), f.to_dict()
    assert (r.verdict, r.action) == (verdict, action), r.summary
    if severity != "info":
        assert (r.code, r.gpu) == (code, gpu)  # the only non-info finding is the worst one
    assert f.evidence and f.detail
    assert not f.drain  # only node-level power findings ask for a drain


def test_rows_have_unique_ids_and_both_sides():
    ids = [r[0] for r in ROWS]
    assert len(ids) == len(set(ids))
    fired = {r[4][2] for r in ROWS if not isinstance(r[4], str)}
    absent = {r[4][len(ABSENT):] for r in ROWS if isinstance(r[4], str)}
    # every code the review listed is asserted both ways (or, for the pure flags, with its N/A side)
    for code in ("temp_shutdown", "temp_slowdown", "temp_tlimit", "temp_high", "memory_temp", "power_over_limit",
                 "power_capped", "persistence_off", "driver_drift", "cuda_drift", "retired_pages_pending",
                 "retired_pages_limit", "ecc_disabled", "nvlink_crc", "disk_full", "memory_low", "gpu_missing",
                 "pcie_replay", "nvlink_down"):
        assert code in fired and code in absent, code
    assert "gpu_count_mismatch" in fired


@pytest.mark.parametrize("name", sorted(MODELS))
def test_profile_picked_by_name(name):
    key, gen, width, nvlinks, watts = MODELS[name]
    p = profile_for(name, PROFILES)
    assert p is not None and p.key == key, p
    assert (p.pcie_gen, p.pcie_width, p.nvlinks, p.power_default_w) == (gen, width, nvlinks, watts)
    assert p is PROFILES[key]


def test_profile_table_covers_every_model():
    assert set(PROFILES) == {m[0] for m in MODELS.values()} == {"A100", "H100", "H200", "B200", "GB200"}
    assert profile_for("NVIDIA L40S", PROFILES) is None
    assert profile_for(None, PROFILES) is None


# ---------------------------------------------------------------------------------------- node-level power brake
@pytest.mark.parametrize("reasons,code", [
    (["hw_power_brake_slowdown", "hw_slowdown"], "node_power_brake"),
    (["hw_slowdown"], "node_hw_slowdown"),
])
def test_node_level_throttle_asks_for_a_drain(reasons, code):
    r = judge(node(*[h100(i, clocks_event_reasons=list(reasons)) for i in range(4)]), (), now=NOW)
    (f,) = [f for f in r.findings if f.severity != "info"]
    assert (f.code, f.severity, f.action, f.gpu, f.drain) == (code, "warning", "monitor", None, True)
    assert (r.verdict, r.action, r.code, r.drain) == ("degraded", "monitor", code, True)
    assert r.drain_reason() == f"gpufleet: {code}"
    # the same reason on one GPU only is that GPU's problem: no drain request
    r = judge(node(h100(0), h100(1, clocks_event_reasons=list(reasons))), (), now=NOW)
    assert r.verdict == "degraded" and not r.drain and r.gpu == 1


def test_drain_flag_is_part_of_finding():
    assert Finding("clocks", "warning", "x", "monitor", "node_power_brake", drain=True).to_dict()["drain"] is True
