# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Health rules over one snapshot, the kernel events in view, and the state of the previous run.

Each rule appends Finding objects; a value that is None (N/A, NotSupported, deprecated) is skipped, never a
failure. Counters are judged as rates between this run and the previous one (state), never as absolutes.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from .catalog import Catalog
from .config import Config
from .kmsg_parse import gpc_tpc_of, group_bursts, recovery_action_of, reset_flags_of
from .model import PROBE_FAILED, PROBE_TIMEOUT, GpuSnapshot, KernelEvent, NvLinkInfo, Snapshot
from .profiles import GpuProfile
from .report import Finding

THROTTLE_REASONS = ("hw_power_brake_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown")
_THROTTLE_CODE = {"hw_power_brake_slowdown": "hw_power_brake", "hw_thermal_slowdown": "hw_thermal",
                  "sw_thermal_slowdown": "sw_thermal", "hw_slowdown": "hw_slowdown"}
_EVIDENCE_MAX = 6


class Ctx:
    def __init__(self, cfg: Config, catalog: Catalog, now: float, prev: Dict[str, Any]):
        self.cfg = cfg
        self.t = cfg.t
        self.catalog = catalog
        self.now = now
        self.prev = prev or {}
        self.prev_gpus = self.prev.get("gpus") or {}
        self.new_gpus: Dict[str, Any] = {}
        self.findings: List[Finding] = []
        self.skipped: List[str] = []
        self.new_state_probe_timeouts = 0  # the probe timeouts in a row, for the next state

    def add(self, check: str, severity: str, detail: str, action: str = "none", code: Optional[str] = None,
            gpu: Optional[int] = None, evidence: Optional[List[str]] = None, pci: Optional[str] = None,
            drain: bool = False) -> None:
        self.findings.append(Finding(check=check, severity=severity, detail=detail, action=action,
                                     code=code or check, gpu=gpu, evidence=list(evidence or [])[:_EVIDENCE_MAX],
                                     pci=pci, drain=drain))


def gpu_key(g: GpuSnapshot) -> str:
    return g.uuid or g.pci or f"index{g.index}"


# ------------------------------------------------------------------ probe and count
def check_probe(ctx: Ctx, snap: Optional[Snapshot], have_kmsg: bool) -> None:
    if snap is None:
        if not have_kmsg:
            ctx.add("probe", "unknown", "no snapshot and no kernel log were given", code="no_data")
        return
    strikes = int(ctx.t["probe_timeout_strikes"])
    count = int(ctx.prev.get("probe_timeouts", 0)) + 1 if snap.probe_status == PROBE_TIMEOUT else 0
    ctx.new_state_probe_timeouts = count
    if snap.probe_status == PROBE_TIMEOUT:
        ev = [snap.probe_error or "probe timed out"]
        if strikes and count >= strikes:
            ctx.add("probe", "critical", f"GPU probe timed out {count} runs in a row (NVML hangs on a wedged GPU)",
                    "reboot", "probe_timeout", evidence=ev)
        else:
            ctx.add("probe", "unknown", "GPU probe timed out; state of the GPUs is unknown", "none", "probe_timeout",
                    evidence=ev)
    elif snap.probe_status == PROBE_FAILED:
        err = snap.probe_error or "probe failed"
        code = snap.probe_error_code
        low = err.lower()
        no_driver = code in (9, 12) or "driver not loaded" in low or "library not found" in low
        if code == 18 or "version mismatch" in low:
            ctx.add("probe", "critical", "NVIDIA driver/library version mismatch (driver upgraded without reboot)",
                    "reboot", "driver_mismatch", evidence=[err])
        elif no_driver and ctx.cfg.expected_gpus == 0:
            # A CPU node (expected_gpus: 0) has no NVIDIA driver by design: healthy, said once as an info finding.
            ctx.add("probe", "info", "no NVIDIA driver and no GPU expected (expected_gpus: 0)", "none",
                    "no_gpu_expected", evidence=[err])
        elif code == 9 or "driver not loaded" in low or "couldn't communicate with the nvidia driver" in low:
            ctx.add("probe", "critical", "NVIDIA kernel driver not loaded", "reboot", "driver_not_loaded",
                    evidence=[err])
        elif code == 12 or "library not found" in low:
            ctx.add("probe", "critical", "NVML library not found (driver userspace missing)", "reimage",
                    "nvml_missing", evidence=[err])
        else:
            ctx.add("probe", "unknown", "GPU probe failed; state of the GPUs is unknown", "none", "probe_failed",
                    evidence=[err])


def check_gpu_count(ctx: Ctx, snap: Snapshot) -> None:
    expected = ctx.cfg.expected_gpus if ctx.cfg.expected_gpus is not None else snap.expected_gpus
    if snap.probe_status in (PROBE_TIMEOUT, PROBE_FAILED):
        return
    visible = sum(1 for g in snap.gpus if not g.lost)
    if expected is None:
        if snap.attached_gpus is not None and snap.attached_gpus > len(snap.gpus):
            expected = snap.attached_gpus
        else:
            return
    if visible < expected:
        ctx.add("gpu_count", "critical", f"{visible} of {expected} expected GPUs visible", "reboot", "gpu_missing",
                evidence=[f"visible={visible}", f"expected={expected}"] +
                [f"gpu{g.index} {g.pci or ''} lost" for g in snap.gpus if g.lost])
    elif visible > expected:
        ctx.add("gpu_count", "warning", f"{visible} GPUs visible but {expected} expected (inventory drift?)",
                "monitor", "gpu_count_mismatch", evidence=[f"visible={visible}", f"expected={expected}"])


# ------------------------------------------------------------------ per GPU
def _rate(ctx: Ctx, prev: Dict[str, Any], key: str, value: Optional[float], t: float) -> Optional[Tuple[float, float]]:
    """(delta, seconds) since the previous run, or None when there is no usable previous value."""
    if value is None:
        return None
    old = prev.get(key)
    old_t = prev.get("t")
    if old is None or old_t is None:
        return None
    dt = t - float(old_t)
    delta = value - float(old)
    if dt <= 0 or delta < 0:  # clock went back, counter reset (driver reload / GPU reset)
        return None
    return delta, dt


def check_gpu(ctx: Ctx, snap: Snapshot, g: GpuSnapshot, prof: Optional[GpuProfile], node_throttle: Set[int]) -> None:
    """Every per-GPU check that is on, in a fixed order (the order of the findings); the counters for rates go into
    this GPU's next state (``ctx.new_gpus``)."""
    on = ctx.cfg.on
    key = gpu_key(g)
    prev = ctx.prev_gpus.get(key) or {}
    ts = snap.timestamp if snap.timestamp is not None else ctx.now
    new: Dict[str, Any] = {"t": ts}
    ctx.new_gpus[key] = new

    if g.lost:
        if on("gpu_lost"):
            ctx.add("gpu_lost", "critical", "GPU is lost (not reachable through NVML)", "reboot", "gpu_lost", g.index,
                    [f"{k}: {v}" for k, v in sorted(g.probe_errors.items())] or ["lost"], g.pci)
        return
    if on("gpu_lost"):
        _check_nvml_errors(ctx, g)
    if on("recovery_action"):
        _check_recovery_action(ctx, g)
    if on("ecc"):
        _check_ecc(ctx, g, prof, prev, ts)
    new["sbe"] = g.ecc_volatile_sbe
    if on("retired_pages"):
        _check_retired_pages(ctx, g)
    if on("row_remap"):
        _check_row_remap(ctx, g)
    if on("temperature"):
        _check_temperature(ctx, g, g.index, g.pci)
    throttled = _throttle_reason(ctx, g, prev, new, ts) if on("clocks") else None
    _persist_throttle(ctx, g, prev, new, throttled, ts, g.index, g.pci, node_throttle)
    if on("power"):
        _check_power(ctx, g, prof)
    if on("pcie_link"):
        _check_pcie_link(ctx, g)
    if on("pcie_replay"):
        _check_pcie_replay(ctx, g, prof, prev, ts)
    new["replay"] = g.pcie_replay_counter
    if on("nvlink") and g.nvlinks is not None:
        new["nvl"] = _check_nvlink(ctx, g, g.nvlinks, prof, prev, ts)
    if on("persistence") and g.persistence_mode is False:
        _check_persistence(ctx, g)
    if on("fabric") and g.fabric_state is not None:
        _check_fabric(ctx, g, g.fabric_state)


def _check_nvml_errors(ctx: Ctx, g: GpuSnapshot) -> None:
    """Errors NVML gave while probing: a reset required, a corrupted InfoROM."""
    i, pci = g.index, g.pci
    errs = " ".join(g.probe_errors.values())
    if "ResetRequired" in errs or "requires reset" in errs.lower():
        ctx.add("gpu_lost", "critical", "NVML reports the GPU requires a reset", "reset_gpu",
                "gpu_reset_required", i, list(g.probe_errors.values()), pci)
    if "CorruptedInforom" in errs or "infoROM is corrupted" in errs:
        ctx.add("gpu_lost", "critical", "InfoROM corrupted", "replace", "inforom_corrupted", i,
                list(g.probe_errors.values()), pci)


def _check_recovery_action(ctx: Ctx, g: GpuSnapshot) -> None:
    """The driver's recovery action, reset required, drain and reset recommended."""
    i, pci = g.index, g.pci
    ra = g.recovery_action
    if ra:
        name, sev, act = ctx.catalog.recovery_action(ra)
        ctx.add("recovery_action", sev, f"GPU requests recovery action: {name}", act, "recovery_action", i,
                [f"gpu_recovery_action={ra} ({name})"], pci)
    if g.reset_required:
        ctx.add("recovery_action", "critical", "driver reports GPU reset required", "reset_gpu", "reset_required",
                i, ["reset_required=Yes"], pci)
    elif g.drain_and_reset_recommended:
        ctx.add("recovery_action", "critical", "driver recommends drain and reset", "reset_gpu",
                "drain_and_reset", i, ["drain_and_reset_recommended=Yes"], pci)


def _check_ecc(ctx: Ctx, g: GpuSnapshot, prof: Optional[GpuProfile], prev: Dict[str, Any], ts: float) -> None:
    """ECC: uncorrectable errors, the correctable rate and lifetime count, ECC off or pending, SRAM threshold."""
    t, i, pci = ctx.t, g.index, g.pci
    if g.ecc_volatile_dbe:
        ctx.add("ecc", "critical", f"{g.ecc_volatile_dbe} uncorrectable ECC error(s) since the last reset",
                "reset_gpu", "ecc_dbe", i, [f"ecc_volatile_uncorrectable={g.ecc_volatile_dbe}"], pci)
    r = _rate(ctx, prev, "sbe", g.ecc_volatile_sbe, ts)
    if r and r[0] / (r[1] / 3600.0) > t["ecc_sbe_volatile_per_h"]:
        ctx.add("ecc", "warning", f"correctable ECC errors at {r[0] / (r[1] / 3600.0):.0f}/h", "monitor",
                "ecc_sbe_rate", i, [f"delta={r[0]:.0f} over {r[1]:.0f}s"], pci)
    if g.ecc_aggregate_sbe is not None and g.ecc_aggregate_sbe > t["ecc_sbe_aggregate_max"]:
        ctx.add("ecc", "warning", f"{g.ecc_aggregate_sbe} correctable ECC errors over the GPU's life", "monitor",
                "ecc_sbe_aggregate", i, [f"ecc_aggregate_correctable={g.ecc_aggregate_sbe}"], pci)
    if g.ecc_enabled is False and (prof is None or prof.ecc_expected):
        ctx.add("ecc", "warning", "ECC is disabled", "monitor", "ecc_disabled", i, ["ecc_mode=Disabled"], pci)
    elif g.ecc_enabled is not None and g.ecc_pending_enabled is not None and \
            g.ecc_enabled != g.ecc_pending_enabled:
        ctx.add("ecc", "warning", "ECC mode change pending (needs a GPU reset or reboot)", "reset_gpu",
                "ecc_mode_pending", i, [f"current={g.ecc_enabled} pending={g.ecc_pending_enabled}"], pci)
    if g.sram_threshold_exceeded:
        ctx.add("ecc", "critical", "SRAM uncorrectable error threshold exceeded (field diagnostics / RMA)",
                "replace", "sram_threshold", i, ["sram_threshold_exceeded=Yes"], pci)


def _check_retired_pages(ctx: Ctx, g: GpuSnapshot) -> None:
    """Retired pages: pending retirement, too many retired."""
    t, i, pci = ctx.t, g.index, g.pci
    total = (g.retired_pages_sbe or 0) + (g.retired_pages_dbe or 0)
    if g.retired_pages_pending:
        ctx.add("retired_pages", "critical", "page retirement pending (reset to retire)", "reset_gpu",
                "retired_pages_pending", i, ["pending_retirement=Yes"], pci)
    if total > t["retired_pages_max"] or (g.retired_pages_dbe or 0) > t["retired_pages_dbe_max"]:
        ctx.add("retired_pages", "critical", f"{total} retired pages ({g.retired_pages_dbe or 0} from DBE)",
                "replace", "retired_pages_limit", i,
                [f"sbe={g.retired_pages_sbe}", f"dbe={g.retired_pages_dbe}"], pci)


def _check_row_remap(ctx: Ctx, g: GpuSnapshot) -> None:
    """Row remapping: failed, pending, many rows remapped."""
    t, i, pci = ctx.t, g.index, g.pci
    if g.remapped_rows_failure:
        ctx.add("row_remap", "critical", "row remapping failed (bank out of spare rows): RMA", "replace",
                "row_remap_failure", i, ["remapped_row_failure=Yes"], pci)
    if g.remapped_rows_pending:
        ctx.add("row_remap", "critical", "row remap pending: drain and reset the GPU", "reset_gpu",
                "row_remap_pending", i, ["remapped_row_pending=Yes",
                                         f"uncorrectable_rows={g.remapped_rows_uncorrectable}"], pci)
    if g.remapped_rows_uncorrectable is not None and g.remapped_rows_uncorrectable >= t["remapped_rows_unc_warn"]:
        ctx.add("row_remap", "warning", f"{g.remapped_rows_uncorrectable} rows remapped for uncorrectable errors",
                "monitor", "row_remap_many", i, [f"remapped_row_unc={g.remapped_rows_uncorrectable}"], pci)


def _check_power(ctx: Ctx, g: GpuSnapshot, prof: Optional[GpuProfile]) -> None:
    """Power: draw above the limit, the limit capped below the default."""
    t, i, pci = ctx.t, g.index, g.pci
    if g.power_draw is not None and g.power_limit and \
            g.power_draw > g.power_limit * (1 + t["power_over_limit_pct"] / 100.0):
        ctx.add("power", "warning", f"power draw {g.power_draw:.0f} W above the {g.power_limit:.0f} W limit",
                "monitor", "power_over_limit", i, [f"draw={g.power_draw} limit={g.power_limit}"], pci)
    default = g.power_default_limit or (prof.power_default_w if prof else None)
    if g.power_limit and default and g.power_limit < default * (1 - t["power_cap_pct"] / 100.0):
        ctx.add("power", "warning", f"power limit {g.power_limit:.0f} W below the default {default:.0f} W "
                "(capped by someone?)", "monitor", "power_capped", i,
                [f"limit={g.power_limit} default={default}"], pci)


def _check_pcie_link(ctx: Ctx, g: GpuSnapshot) -> None:
    """The PCIe link: narrower than it can be, a lower generation under load."""
    i, pci = g.index, g.pci
    if g.pcie_width_current and g.pcie_width_max and g.pcie_width_current < g.pcie_width_max:
        ctx.add("pcie_link", "warning", f"PCIe link x{g.pcie_width_current} below its x{g.pcie_width_max}",
                "reboot", "pcie_width", i, [f"width={g.pcie_width_current}/{g.pcie_width_max}"], pci)
    if g.pcie_gen_current and g.pcie_gen_max and g.pcie_gen_current < g.pcie_gen_max and _busy(ctx, g):
        ctx.add("pcie_link", "warning", f"PCIe Gen{g.pcie_gen_current} under load, link supports "
                f"Gen{g.pcie_gen_max}", "monitor", "pcie_gen", i,
                [f"gen={g.pcie_gen_current}/{g.pcie_gen_max}", f"util={g.utilization_gpu}"], pci)


def _check_pcie_replay(ctx: Ctx, g: GpuSnapshot, prof: Optional[GpuProfile], prev: Dict[str, Any], ts: float) -> None:
    """PCIe replays per minute against the limit for the link's generation and width."""
    t, i, pci = ctx.t, g.index, g.pci
    r = _rate(ctx, prev, "replay", g.pcie_replay_counter, ts)
    if r:
        gen = g.pcie_gen_max or g.pcie_gen_current or (prof.pcie_gen if prof else 5)
        gen = min(max(int(gen), 3), 6)
        width = g.pcie_width_current or g.pcie_width_max or 16
        limit = t[f"pcie_replay_per_min_gen{gen}"] * width / 16.0
        per_min = r[0] / (r[1] / 60.0)
        if per_min > limit:
            ctx.add("pcie_replay", "warning", f"PCIe replays at {per_min:.1f}/min (limit {limit:.0f}/min at "
                    f"Gen{gen} x{width})", "monitor", "pcie_replay", i,
                    [f"replay_counter={g.pcie_replay_counter}", f"delta={r[0]:.0f} over {r[1]:.0f}s"], pci)


def _check_nvlink(ctx: Ctx, g: GpuSnapshot, links: List[NvLinkInfo], prof: Optional[GpuProfile],
                  prev: Dict[str, Any], ts: float) -> Dict[str, Any]:
    """NVLink (``links``, the GPU's read links): inactive links, recoveries, CRC error rates; returns the counters
    for the next state."""
    t, i, pci = ctx.t, g.index, g.pci
    down = [n.link for n in links if n.active is False]
    if down and (prof is None or prof.nvlinks > 0):
        ctx.add("nvlink", "critical", f"NVLink link(s) {', '.join(map(str, down))} inactive", "reset_gpu",
                "nvlink_down", i, [f"inactive={down}", f"links={len(links)}"], pci)
    nv_prev = prev.get("nvl") or {}
    nv_new = {}
    for n in links:
        for attr in ("replay_errors", "recovery_errors", "crc_flit_errors", "crc_data_errors"):
            v = getattr(n, attr)
            if v is None:
                continue
            k = f"{n.link}:{attr}"
            nv_new[k] = v
            old = nv_prev.get(k)
            if old is None or prev.get("t") is None or v < old:
                continue
            dt = max(ts - float(prev["t"]), 1e-6)
            if attr == "recovery_errors" and v > old:
                ctx.add("nvlink", "warning", f"NVLink {n.link} recovered {v - old} time(s) since the last run",
                        "monitor", "nvlink_recovery", i, [f"link {n.link} recovery {old}->{v}"], pci)
            elif attr.startswith("crc") and (v - old) / dt > t["nvlink_crc_per_s"]:
                ctx.add("nvlink", "critical", f"NVLink {n.link} CRC errors at {(v - old) / dt:.0f}/s",
                        "reset_gpu", "nvlink_crc", i, [f"link {n.link} {attr} {old}->{v}"], pci)
    return nv_new


def _check_persistence(ctx: Ctx, g: GpuSnapshot) -> None:
    """Persistence mode off."""
    i, pci = g.index, g.pci
    sev = "warning" if ctx.cfg.require_persistence else "info"
    ctx.add("persistence", sev, "persistence mode off (slow NVML init; enable nvidia-persistenced)",
            "monitor" if sev == "warning" else "none", "persistence_off", i, ["persistence_mode=Disabled"], pci)


def _check_fabric(ctx: Ctx, g: GpuSnapshot, state: str) -> None:
    """Fabric registration (fabric manager / NVSwitch; ``state``, the GPU's read fabric state) and fabric health."""
    i, pci, status = g.index, g.pci, g.fabric_status
    if state.lower() == "in progress":
        ctx.add("fabric", "warning", "fabric registration in progress", "monitor", "fabric_in_progress", i,
                [f"state={state}", f"status={status}"], pci)
    elif state.lower() != "completed" or (status is not None and status.lower() != "success"):
        ctx.add("fabric", "critical", f"fabric state {state}/{status} (fabric manager / NVSwitch)", "reset_gpu",
                "fabric", i, [f"state={state}", f"status={status}"], pci)
    bad = sorted(k for k, v in g.fabric_health.items() if v and v.lower() in ("true", "yes", "degraded"))
    if bad:
        ctx.add("fabric", "warning", f"fabric health: {', '.join(bad)}", "monitor", "fabric_health", i,
                [f"{k}={g.fabric_health[k]}" for k in bad], pci)


def _busy(ctx: Ctx, g: GpuSnapshot) -> bool:
    if g.utilization_gpu is not None:
        return g.utilization_gpu >= ctx.t["pcie_busy_util_pct"]
    return False  # unknown load: the generation may legitimately be down-trained at idle


def _check_temperature(ctx: Ctx, g: GpuSnapshot, i: int, pci: Optional[str]) -> None:
    temp = g.temperature
    if temp is not None and g.temp_shutdown is not None and temp >= g.temp_shutdown - 2:
        ctx.add("temperature", "critical", f"GPU at {temp:.0f} C, shutdown at {g.temp_shutdown:.0f} C", "monitor",
                "temp_shutdown", i, [f"temp={temp} shutdown={g.temp_shutdown}"], pci)
    elif temp is not None and g.temp_slowdown is not None and temp >= g.temp_slowdown:
        ctx.add("temperature", "warning", f"GPU at {temp:.0f} C, slowdown at {g.temp_slowdown:.0f} C", "monitor",
                "temp_slowdown", i, [f"temp={temp} slowdown={g.temp_slowdown}"], pci)
    elif g.temp_tlimit is not None and g.temp_tlimit <= ctx.t["temp_tlimit_warn_c"]:
        ctx.add("temperature", "warning", f"GPU {g.temp_tlimit:.0f} C from its T.Limit (slowdown imminent)",
                "monitor", "temp_tlimit", i, [f"tlimit={g.temp_tlimit}"], pci)
    elif temp is not None and g.temp_slowdown is None and g.temp_tlimit is None and temp >= ctx.t["temp_abs_warn_c"]:
        ctx.add("temperature", "warning", f"GPU at {temp:.0f} C", "monitor", "temp_high", i, [f"temp={temp}"], pci)
    if g.memory_temperature is not None and g.memory_temp_max is not None and \
            g.memory_temperature >= g.memory_temp_max:
        ctx.add("temperature", "warning", f"memory at {g.memory_temperature:.0f} C, max {g.memory_temp_max:.0f} C",
                "monitor", "memory_temp", i, [f"memory_temp={g.memory_temperature}"], pci)


def _throttle_reason(ctx: Ctx, g: GpuSnapshot, prev: Dict[str, Any], new: Dict[str, Any], ts: float) -> Optional[str]:
    """The most specific HW/thermal clocks-event reason active now (bits) or over the window (counters)."""
    active = set(g.clocks_event_reasons or ())
    counters = g.clocks_event_counters_us or {}
    old = prev.get("ctr") or {}
    if counters:
        new["ctr"] = dict(counters)
    if old and prev.get("t") is not None:
        dt = ts - float(prev["t"])
        for name, v in counters.items():
            o = old.get(name)
            if name in THROTTLE_REASONS and o is not None and dt > 0 and v >= o and \
                    (v - o) / (dt * 1e6) > ctx.t["throttle_fraction_warn"]:
                active.add(name)
    for name in THROTTLE_REASONS:
        if name in active:
            return name
    return None


def _persist_throttle(ctx: Ctx, g: GpuSnapshot, prev: Dict[str, Any], new: Dict[str, Any], reason: Optional[str],
                      ts: float, i: int, pci: Optional[str], node_throttle: Set[int]) -> None:
    if reason is None:
        new["thr_runs"], new["thr_since"] = 0, None
        return
    runs = int(prev.get("thr_runs") or 0) + 1
    prev_since: Optional[float] = prev.get("thr_since")
    since = prev_since if prev_since is not None else ts
    new["thr_runs"], new["thr_since"] = runs, since
    if g.index in node_throttle:
        return  # reported once for the node
    persistent = runs >= ctx.t["throttle_persist_runs"] and ts - since >= ctx.t["throttle_persist_s"]
    reasons = sorted(set(g.clocks_event_reasons or ()) - {"gpu_idle"})
    ev = [f"clocks_event_reasons={','.join(reasons) or reason}", f"consecutive_runs={runs}"]
    code = _THROTTLE_CODE[reason]
    thermal = "thermal" in reason
    if persistent:
        ctx.add("clocks", "critical", f"{reason.replace('_', ' ')} persists for {runs} runs / {ts - since:.0f} s",
                "monitor" if thermal else "reset_gpu", code, i, ev, pci)
    else:
        ctx.add("clocks", "warning", f"{reason.replace('_', ' ')} active (escalates if it persists)", "monitor",
                code, i, ev, pci)


def node_throttle_set(snap: Snapshot) -> set:
    """GPU indexes when every present GPU (2 or more) shows HW power brake / HW slowdown: a node-level cause."""
    present = [g for g in snap.gpus if not g.lost]
    if len(present) < 2:
        return set()
    for reason in ("hw_power_brake_slowdown", "hw_slowdown"):
        if all(reason in (g.clocks_event_reasons or ()) for g in present):
            return {g.index for g in present}
    return set()


def check_node_throttle(ctx: Ctx, snap: Snapshot, idx: set) -> None:
    if not idx:
        return
    present = [g for g in snap.gpus if not g.lost]
    brake = all("hw_power_brake_slowdown" in (g.clocks_event_reasons or ()) for g in present)
    what = "HW power brake" if brake else "HW slowdown"
    ctx.add("clocks", "warning", f"{what} active on all {len(present)} GPUs: node-level power delivery problem "
            "(PSU / BMC power capping); drain and investigate the node, do not reset GPUs", "monitor",
            "node_power_brake" if brake else "node_hw_slowdown", None,
            [f"gpu{g.index}: {','.join(sorted(set(g.clocks_event_reasons or ()) - {'gpu_idle'}))}" for g in present],
            drain=True)  # no GPU-level repair applies: take the node out of service for a person


def check_driver(ctx: Ctx, snap: Snapshot) -> None:
    if ctx.cfg.expected_driver and snap.driver_version and snap.driver_version != ctx.cfg.expected_driver:
        ctx.add("driver", "warning", f"driver {snap.driver_version}, expected {ctx.cfg.expected_driver}", "reimage",
                "driver_drift", evidence=[f"driver_version={snap.driver_version}"])
    if ctx.cfg.expected_cuda and snap.cuda_version and snap.cuda_version != ctx.cfg.expected_cuda:
        ctx.add("driver", "warning", f"CUDA {snap.cuda_version}, expected {ctx.cfg.expected_cuda}", "reimage",
                "cuda_drift", evidence=[f"cuda_version={snap.cuda_version}"])


def check_node(ctx: Ctx, snap: Snapshot) -> None:
    cfg, t = ctx.cfg, ctx.t
    if cfg.on("ib") and snap.ib_ports:
        for p in snap.ib_ports:
            if p.state is not None and "ACTIVE" not in p.state.upper():
                ctx.add("ib", "critical", f"{p.link_layer or 'IB'} port {p.name} is {p.state}", "reboot", "ib_down",
                        evidence=[f"{p.name} state={p.state} phys={p.phys_state}"])
            elif t["ib_min_rate_gbps"] and p.rate_gbps is not None and p.rate_gbps < t["ib_min_rate_gbps"]:
                ctx.add("ib", "warning", f"port {p.name} at {p.rate_gbps:g} Gb/s, expected {t['ib_min_rate_gbps']:g}",
                        "monitor", "ib_rate", evidence=[f"{p.name} rate={p.rate_gbps}"])
    if cfg.on("mounts"):
        present = {m.path for m in (snap.mounts or []) if m.present}
        if snap.mounts is not None:
            for path in cfg.required_mounts:
                if path not in present:
                    ctx.add("mounts", "critical", f"required mount {path} missing", "reboot", "mount_missing",
                            evidence=[path])
    if cfg.on("disk"):
        for d in snap.disks or []:
            if d.total_bytes and d.free_bytes is not None:
                pct = 100.0 * d.free_bytes / d.total_bytes
                if pct < t["disk_free_min_pct"]:
                    ctx.add("disk", "warning", f"{d.path} {pct:.1f}% free", "monitor", "disk_full",
                            evidence=[f"{d.path} free={d.free_bytes} total={d.total_bytes}"])
    if cfg.on("memory") and snap.memory_total_bytes and snap.memory_available_bytes is not None:
        pct = 100.0 * snap.memory_available_bytes / snap.memory_total_bytes
        if pct < t["memory_available_min_pct"]:
            ctx.add("memory", "warning", f"{pct:.1f}% of host memory available", "monitor", "memory_low",
                    evidence=[f"available={snap.memory_available_bytes} total={snap.memory_total_bytes}"])


# ------------------------------------------------------------------ kernel events
def check_events(ctx: Ctx, events: List[KernelEvent], pci_to_gpu: Dict[str, GpuSnapshot],
                 profiles_by_gpu: Dict[int, Optional[GpuProfile]]) -> None:
    cfg, t = ctx.cfg, ctx.t
    xids = [e for e in events if e.kind in ("xid", "fallen_off_bus")]
    sxids = [e for e in events if e.kind == "sxid"]
    rate_limited = {e.pci for e in events if e.kind == "rate_limit"}

    def gpu_of(pci: Optional[str]) -> Optional[GpuSnapshot]:
        return pci_to_gpu.get(pci) if pci is not None else None

    if cfg.on("xid") and xids:
        bursts = group_bursts(xids, t["burst_window_s"])
        bursts_by_key: Dict[Tuple[Optional[str], int], List[List[KernelEvent]]] = {}
        for b in bursts:
            if b[0].xid is not None:  # always set by the parser; an event without its number has nothing to judge
                bursts_by_key.setdefault((b[0].pci, b[0].xid), []).append(b)
        codes_by_pci: Dict[Optional[str], Set[int]] = {}
        for (pci, code) in bursts_by_key:
            codes_by_pci.setdefault(pci, set()).add(code)
        for (pci, code), blist in bursts_by_key.items():
            gsnap = gpu_of(pci)
            gpu = gsnap.index if gsnap is not None else None
            _xid_finding(ctx, pci, code, blist, codes_by_pci.get(pci, set()), gpu,
                         profiles_by_gpu.get(gpu) if gpu is not None else None, gsnap, pci in rate_limited)
    if cfg.on("sxid") and sxids:
        events_by_key: Dict[Tuple[Optional[str], int], List[KernelEvent]] = {}
        for e in sxids:
            if e.xid is not None:
                events_by_key.setdefault((e.pci, e.xid), []).append(e)
        for (pci, code), evs in events_by_key.items():
            fatal = any(e.severity == "Fatal" for e in evs)
            nonfatal = all(e.severity == "Non-fatal" for e in evs)
            entry = ctx.catalog.sxid(code, True if fatal else (False if nonfatal else None))
            sev, act = entry.severity, entry.action
            detail = f"SXid {code} on NVSwitch {evs[0].switch} ({entry.name}) x{len(evs)}"
            if sev == "info" and not fatal:
                span = _span_h(evs)
                if len(evs) / span > t["sxid_nonfatal_per_h"]:
                    sev, act, detail = "warning", "monitor", detail + " at a high rate"
            if sev == "critical":
                detail += ": drain, then reset the fabric (all GPUs + fabric manager) or reboot"
            ctx.add("sxid", sev, detail, act, f"sxid{code}", None, _ev_lines(evs), pci)


def _span_h(evs: List[KernelEvent]) -> float:
    ts = [e.wallclock for e in evs if e.wallclock is not None] or [e.monotonic for e in evs if e.monotonic is not None]
    if len(ts) < 2:
        return 1.0
    return max((max(ts) - min(ts)) / 3600.0, 1.0)


def _ev_lines(evs: List[KernelEvent]) -> List[str]:
    if len(evs) <= _EVIDENCE_MAX:
        return [e.raw[:400] for e in evs]
    return [e.raw[:400] for e in evs[:_EVIDENCE_MAX - 1]] + [f"... {len(evs) - _EVIDENCE_MAX} more ...",
                                                             evs[-1].raw[:400]]


def _xid_finding(ctx: Ctx, pci: Optional[str], code: int, bursts: List[List[KernelEvent]], codes_here: Set[int],
                 gpu: Optional[int],
                 prof: Optional[GpuProfile], gsnap: Optional[GpuSnapshot], rate_limited: bool) -> None:
    entry = ctx.catalog.xid(code)
    evs = [e for b in bursts for e in b]
    sev, act = entry.severity, entry.action
    n = len(evs)
    where = f"{len(bursts)} burst{'s' if len(bursts) != 1 else ''}, {n} line{'s' if n != 1 else ''}"
    detail = f"Xid {code} {entry.name} ({where})"
    if rate_limited and code in (119, 120):
        detail += "; driver rate-limits these prints, counts are lower bounds"
    evidence = _ev_lines(evs)
    label = f"xid{code}"
    if code == 154:
        last = None
        for e in evs:
            v = recovery_action_of(e)
            if v is not None:
                last = v
        if last is None:
            sev, act = "warning", "monitor"
            detail = "Xid 154 recovery action changed (value not readable)"
        else:
            name, sev, act = ctx.catalog.recovery_action(last)
            detail = f"Xid 154: GPU recovery action is now {name} (0x{last:x})"
            if last == 4:
                detail += ": drain the node, then reset the GPU"
    elif 144 <= code <= 150 and entry.bucket == "WORKFLOW_NVLINK5_ERR":
        fatal = [e for e in evs if e.severity == "Fatal"]
        if fatal and 154 in codes_here:
            sev, act = "info", "none"
            detail += f"; {len(fatal)} Fatal: the paired Xid 154 decides the action"
        elif fatal:
            sev, act = "critical", "reset_gpu"
            detail += f"; {len(fatal)} Fatal NVLink5 error(s) without Xid 154: drain and reset"
        elif n / _span_h(evs) > ctx.t["nvlink5_nonfatal_per_h"]:
            sev, act = "warning", "monitor"
            detail += "; Nonfatal at a high rate"
        else:
            detail += "; Nonfatal: counted"
    elif code == 48 and codes_here & {63, 64}:
        detail += " with row remap event (Xid 63/64): drain and reset the GPU"
    elif code == 63:
        if gsnap is not None and gsnap.remapped_rows_pending is False:
            sev, act = "info", "none"
            detail += "; the snapshot shows no remap pending any more"
        else:
            detail += "; row remap pending until the GPU is reset"
    elif code in (94, 95):
        flags = [reset_flags_of(e) for e in evs]
        if any(f and f[1] for f in flags):
            sev, act = "critical", "reset_gpu"
            detail += "; D-RST: Yes (drain and reset required)"
        elif code == 94 and any(f and f[0] for f in flags):
            detail += "; RST: Yes (reset the GPU when convenient)"
        elif code == 94:
            detail += "; contained to the application: reset when convenient"
        if code == 95 and prof is not None and prof.key == "A100" and gsnap is not None and not gsnap.mig_enabled:
            act = "reboot"
            detail += " (A100 without MIG: reboot)"
    elif code in (13, 31):
        units: Dict[Any, int] = {}
        for b in bursts:
            seen = {gpc_tpc_of(e) for e in b} - {None}
            for u in seen:
                units[u] = units.get(u, 0) + 1
        rep = sorted((c, u) for u, c in units.items() if c >= 2)
        if code == 13 and rep:
            c, u = rep[-1]
            detail += f"; GPC {u[0]} TPC {u[1]} repeats in {c} bursts (if it keeps repeating, run DCGM EUD)"
        elif code == 31 and len(bursts) >= 2:
            detail += f"; repeats in {len(bursts)} bursts on this GPU (if it keeps repeating, run DCGM EUD)"
        else:
            detail += "; application fault, no node action"
    elif code == 79:
        detail += ": drain and reboot; if it repeats after a reboot, reseat/RMA"
    if entry.bucket == "UNKNOWN":
        label = f"xid{code}"
    ctx.add("xid", sev, detail, act, label, gpu, evidence, pci)
