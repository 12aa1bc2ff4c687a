# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Configuration of the health rules: defaults, validation with errors that name the field."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .. import spec

_FAIL = spec.raising(ValueError)  # the health rules' callers catch ValueError

CHECKS = ("probe", "gpu_count", "gpu_lost", "ecc", "retired_pages", "row_remap", "recovery_action", "temperature",
          "clocks", "power", "pcie_link", "pcie_replay", "nvlink", "persistence", "fabric", "driver", "xid", "sxid",
          "ib", "mounts", "disk", "memory")

DEFAULT_THRESHOLDS: Dict[str, float] = {
    # kernel events
    "burst_window_s": 180.0,          # Xids of one GPU and code closer than this are one burst (NVSentinel: 3 min)
    "sticky_window_s": 10800.0,       # severe Xids stay in view 3 h (NVSentinel sticky set)
    "event_window_s": 3600.0,         # other events stay in view 1 h
    "sxid_nonfatal_per_h": 100.0,     # non-fatal SXids per hour before they count as a warning
    "nvlink5_nonfatal_per_h": 100.0,
    # PCIe replays per minute at x16 (DCGM: ceil(lanes x per-lane rate)); scaled by the link width
    "pcie_replay_per_min_gen3": 8.0,
    "pcie_replay_per_min_gen4": 16.0,
    "pcie_replay_per_min_gen5": 31.0,
    "pcie_replay_per_min_gen6": 62.0,
    "pcie_busy_util_pct": 20.0,       # the PCIe generation is judged only while the GPU is at least this busy
    # memory errors
    "ecc_sbe_volatile_per_h": 1000.0,
    "ecc_sbe_aggregate_max": 50_000_000.0,   # gcm
    "retired_pages_max": 62.0,               # DCGM: >= 63 retired pages fails
    "retired_pages_dbe_max": 15.0,
    "remapped_rows_unc_warn": 512.0,         # DCGM warns at 512 uncorrectable remapped rows
    # thermal / power / clocks
    "temp_tlimit_warn_c": 0.0,        # degrees below T.Limit at or under which we warn
    "temp_abs_warn_c": 93.0,          # absolute warning when the driver gives no thresholds (cyclecloud)
    "throttle_fraction_warn": 0.05,   # share of the window spent in HW slowdown / brake / thermal (counters)
    "throttle_persist_runs": 3,       # consecutive throttled runs ...
    "throttle_persist_s": 600.0,      # ... spanning at least this long -> escalate
    "power_over_limit_pct": 5.0,
    "power_cap_pct": 2.0,             # enforced limit below the default by more than this -> someone capped it
    # NVLink
    "nvlink_crc_per_s": 100.0,
    # probe
    "probe_timeout_strikes": 0,       # consecutive probe timeouts that turn "unknown" into "unhealthy" (0 = never)
    # node
    "ib_min_rate_gbps": 0.0,          # 0 = do not judge the rate
    "disk_free_min_pct": 5.0,
    "memory_available_min_pct": 5.0,
}

_KEYS = ("expected_gpus", "thresholds", "skip_checks", "xid_overrides", "sxid_overrides", "profiles", "profile",
         "expected_driver", "expected_cuda", "required_mounts", "boot_time", "events_as_of",
         "hostname", "require_persistence")


class Config:
    def __init__(self, raw: Optional[Mapping[str, Any]] = None):
        raw = spec.mapping(raw, "config", _KEYS, fail=_FAIL)
        self.expected_gpus = _opt_int(raw.get("expected_gpus"), "expected_gpus", minimum=0)
        th = spec.mapping(raw.get("thresholds") or {}, "thresholds", fail=_FAIL)
        self.t = dict(DEFAULT_THRESHOLDS)
        for k, v in th.items():
            if k not in DEFAULT_THRESHOLDS:  # named one by one: the list of thresholds is long
                raise _FAIL(f"thresholds.{k}", f"unknown threshold (expected one of "
                                               f"{', '.join(sorted(DEFAULT_THRESHOLDS))})")
            if isinstance(v, str):  # a number written as text ("85") in a role variable
                try:
                    v = float(v)
                except ValueError:
                    pass
            self.t[k] = spec.number(v, f"thresholds.{k}", minimum=0, fail=_FAIL)
        skip = raw.get("skip_checks") or []
        if isinstance(skip, str):
            skip = [s.strip() for s in skip.split(",") if s.strip()]
        if not isinstance(skip, (list, tuple, set, frozenset)):
            raise ValueError(f"skip_checks: expected a list of check names, got {type(skip).__name__}")
        bad = sorted(str(s) for s in skip if s not in CHECKS)
        if bad:
            raise ValueError(f"skip_checks: unknown check(s) {', '.join(bad)} (expected from {', '.join(CHECKS)})")
        self.skip = frozenset(skip)
        self.xid_overrides = _mapping(raw.get("xid_overrides"), "xid_overrides")
        self.sxid_overrides = _mapping(raw.get("sxid_overrides"), "sxid_overrides")
        self.profiles = _mapping(raw.get("profiles"), "profiles")
        self.profile = _opt_str(raw.get("profile"), "profile")
        self.expected_driver = _opt_str(raw.get("expected_driver"), "expected_driver")
        self.expected_cuda = _opt_str(raw.get("expected_cuda"), "expected_cuda")
        mounts = raw.get("required_mounts") or []
        if not isinstance(mounts, (list, tuple)) or not all(isinstance(m, str) for m in mounts):
            raise ValueError("required_mounts: expected a list of mount point paths")
        self.required_mounts = list(mounts)
        bt = raw.get("boot_time")
        if bt is not None and (isinstance(bt, bool) or not isinstance(bt, (int, float))):
            raise ValueError(f"boot_time: expected epoch seconds (number), got {bt!r}")
        self.boot_time = bt
        self.events_as_of = spec.choice(raw.get("events_as_of") or "now", "events_as_of", ("now", "latest"),
                                        fail=_FAIL)
        self.hostname = _opt_str(raw.get("hostname"), "hostname")
        self.require_persistence = spec.boolean(raw.get("require_persistence", False), "require_persistence",
                                                fail=_FAIL)

    def on(self, check: str) -> bool:
        return check not in self.skip


def _opt_int(v: Any, field: str, minimum: Optional[int] = None) -> Optional[int]:
    """An integer or nothing; a whole number written as a float or as text (a role variable) counts."""
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    elif isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            pass
    return spec.integer(v, field, minimum, fail=_FAIL)


def _opt_str(v: Any, field: str) -> Optional[str]:
    if v is None or v == "":
        return None
    return spec.string(v, field, empty_ok=True, fail=_FAIL)


def _mapping(v: Any, field: str) -> Dict[Any, Any]:
    return spec.mapping(v, field, fail=_FAIL)
