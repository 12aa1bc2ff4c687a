# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus text exposition of one health check, for node_exporter's textfile collector.

``prometheus_text(report, snapshot, ...)`` turns the report and the snapshot the check judged into the text format
(``# HELP`` / ``# TYPE`` / samples), accepted by ``promtool check metrics``. Only values the snapshot holds are
written: a field the source could not read (``None``) gives no sample, never a made-up zero.

Labels follow the habits of node_exporter and NVIDIA's dcgm-exporter: every series carries ``node``; per-GPU
series carry ``gpu`` (the index) and ``pci_bus_id``; ``gpufleet_gpu_info`` carries the GPU's ``uuid``,
``model_name`` and ``driver_version`` (dcgm-exporter's ``UUID``, ``modelName``, ``DCGM_FI_DRIVER_VERSION``, in the
snake_case that Prometheus' naming rules and ``promtool check metrics`` ask for) so a GPU can be followed across
re-enumeration or an RMA with ``... * on(node, gpu) group_left(uuid, model_name) gpufleet_gpu_info``.

Counters that must survive between runs (checks, probe failures, Xids per GPU) live in the agent's state file
under the key ``metrics``: ``update_counters(previous, snapshot, kernel_events)`` returns the next value. Without a
state file they restart from zero every run, which Prometheus treats as a counter reset.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from ..promtext import Writer, num
from .kmsg_parse import parse_kmsg
from .model import CLOCK_REASON_BITS, PROBE_FAILED, PROBE_TIMEOUT, GpuSnapshot, NvLinkInfo, Snapshot
from .report import ACTION_ORDER, SEVERITIES, VERDICTS, Report, action_rank

PROM_FILE = "gpufleet_health.prom"
#: The series a reader of the agent's history takes back (the simulator's export writes them, its calibrate reads them).
VERDICT_METRIC = "gpufleet_health_verdict"
DRAIN_METRIC = "gpufleet_health_drain_requested"
FINDING_METRIC = "gpufleet_health_finding"
LAST_RUN_METRIC = "gpufleet_health_last_run_timestamp_seconds"
DURATION_METRIC = "gpufleet_health_check_duration_seconds"
XID_METRIC = "gpufleet_gpu_xid_errors_total"


def finding_labels(node: str, check: str, code: str, gpu: Any, severity: str, action: str) -> Dict[str, Any]:
    """The labels of one ``gpufleet_health_finding`` series (a finding without a GPU: an empty ``gpu``)."""
    return {"node": node, "check": check, "code": code, "gpu": "" if gpu is None else gpu, "severity": severity,
            "action": action}


NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")
_SEEN_MAX = 1000  # kernel-event idents remembered so a replayed log is not counted twice


# ------------------------------------------------------------------ counters kept in the state file
def _count_map(d: Any) -> Dict[str, int]:
    if not isinstance(d, Mapping):
        return {}
    return {str(k): int(v) for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def update_counters(previous: Any, snap: Optional[Snapshot], kernel_lines: Any) -> Dict[str, Any]:
    """Next value of the counters kept between runs.

    previous: the ``metrics`` entry of the last state (anything; a corrupt entry restarts the counters).
    kernel_lines: what the agent judged (text, lines or KernelEvent objects). Xids are counted per PCI address and
    code; an event already counted (same ident) is not counted again, so replaying a captured log is idempotent.
    """
    prev = previous if isinstance(previous, Mapping) else {}
    checks = prev.get("checks")
    checks = checks + 1 if isinstance(checks, int) and not isinstance(checks, bool) and checks >= 0 else 1
    probe = _count_map(prev.get("probe_failures"))
    if snap is not None and snap.probe_status in (PROBE_TIMEOUT, PROBE_FAILED):
        probe[snap.probe_status] = probe.get(snap.probe_status, 0) + 1
    xid = _count_map(prev.get("xid"))
    last = {str(k): v for k, v in (prev.get("xid_last") or {}).items()} \
        if isinstance(prev.get("xid_last"), Mapping) else {}
    last = {k: v for k, v in last.items() if isinstance(v, int) and not isinstance(v, bool)}
    seen_list = [s for s in (prev.get("seen") or []) if isinstance(s, str)] \
        if isinstance(prev.get("seen"), list) else []
    seen = set(seen_list)
    events = parse_kmsg(kernel_lines) if kernel_lines else []
    for ev in events:
        if ev.kind not in ("xid", "fallen_off_bus") or ev.xid is None or not ev.pci:
            continue
        ident = ev.ident
        if ident in seen:
            continue
        seen.add(ident)
        seen_list.append(ident)
        key = f"{ev.pci}|{ev.xid}"
        xid[key] = xid.get(key, 0) + 1
        last[ev.pci] = int(ev.xid)
    return {"checks": checks, "probe_failures": probe, "xid": xid, "xid_last": last,
            "seen": seen_list[-_SEEN_MAX:]}


# ------------------------------------------------------------------ the text
def prometheus_text(report: Report, snap: Optional[Snapshot], duration_s: float, node: str,
                    slurm: Optional[Dict[str, Any]] = None, counters: Optional[Mapping[str, Any]] = None,
                    now: Optional[float] = None) -> str:
    """The textfile for one check. ``counters``: the value ``update_counters`` returned (None: no counters)."""
    w = Writer()
    n = {"node": node}
    verdict, action = report.verdict, report.action
    w.metric(VERDICT_METRIC, "Node health verdict (1 for the current one).", "gauge",
             [({"node": node, "verdict": v}, int(v == verdict)) for v in VERDICTS])
    w.metric("gpufleet_health_action", "Recommended action (1 for the current one).", "gauge",
             [({"node": node, "action": a}, int(a == action)) for a in ACTION_ORDER])
    w.metric("gpufleet_health_action_rank", "Recommended action as a number: 0 none, 1 monitor, 2 reset_gpu, "
             "3 reboot, 4 reimage, 5 replace.", "gauge", [(n, action_rank(action))])
    w.metric(DRAIN_METRIC, "1 when a finding asks for the node to be drained although no "
             "automatic repair applies (node-level power brake / HW slowdown).", "gauge", [(n, int(report.drain))])
    w.metric("gpufleet_health_exit_code", "Exit code of the last check (0 healthy .. 3 unknown).", "gauge",
             [(n, report.exit_code)])
    counts = {s: 0 for s in SEVERITIES}
    for f in report.findings:
        counts[f.severity] += 1
    w.metric("gpufleet_health_findings", "Findings of the last check by severity.", "gauge",
             [({"node": node, "severity": s}, c) for s, c in counts.items()])
    seen = set()
    samples = []
    for f in report.findings:
        if f.severity == "info":
            continue
        labels = finding_labels(node, f.check, f.code, f.gpu, f.severity, f.action)
        key = tuple(labels.items())
        if key not in seen:
            seen.add(key)
            samples.append((labels, 1))
    w.metric(FINDING_METRIC, "One series per non-informational finding of the last check.", "gauge",
             samples, always=True)
    w.metric(LAST_RUN_METRIC, "When the last check ran (Unix time).", "gauge",
             [(n, float(report.checked_at or now or 0.0))])
    w.metric(DURATION_METRIC, "Wall time of the last check.", "gauge",
             [(n, float(duration_s))])
    if slurm is not None:
        w.metric("gpufleet_health_drained", "1 when this check drained the node.", "gauge",
                 [(n, int(slurm.get("action") == "drained"))])
        w.metric("gpufleet_health_slurm_drained", "1 when the node is drained with a gpufleet reason (drained by "
                 "this check or an earlier one).", "gauge",
                 [(n, int(slurm.get("action") in ("drained", "already_drained")))])
        w.metric("gpufleet_health_drain_held", "1 when the report asks for a drain that the agent leaves to the "
                 "repair run (a warning: the node still runs jobs), until the node is drained.", "gauge",
                 [(n, int(slurm.get("action") == "defer"))])
    if counters is not None:
        _counters(w, node, snap, counters)
    if snap is not None:
        _probe(w, node, snap)
        _gpus(w, node, snap)
    return w.text()


def _probe(w: Writer, node: str, snap: Snapshot) -> None:
    n = {"node": node}
    w.metric("gpufleet_health_probe_ok", "1 when the GPU probe answered (ok or partial).", "gauge",
             [({"node": node, "source": snap.source or ""}, int(snap.probe_status in ("ok", "partial")))])
    total_ms = snap.probe_durations_ms.get("total") if isinstance(snap.probe_durations_ms, Mapping) else None
    if total_ms is not None and num(total_ms) is not None:
        w.metric("gpufleet_health_probe_duration_seconds", "Wall time of the GPU probe (NVML probes only).", "gauge",
                 [(n, float(total_ms) / 1000.0)])
    w.metric("gpufleet_health_gpus_visible", "GPUs that answered the probe.", "gauge",
             [(n, sum(1 for g in snap.gpus if not g.lost))])
    if snap.attached_gpus is not None:
        w.metric("gpufleet_health_gpus_attached", "GPUs the driver reports attached.", "gauge",
                 [(n, snap.attached_gpus)])


def _gpu_labels(node: str, g: GpuSnapshot) -> Dict[str, Any]:
    return {"node": node, "gpu": g.index, "pci_bus_id": g.pci or ""}


def _gpus(w: Writer, node: str, snap: Snapshot) -> None:
    w.metric("gpufleet_gpu_info", "GPU identity (always 1): UUID, model, serial, VBIOS, driver; join on node and gpu.",
             "gauge",
             [({"node": node, "gpu": g.index, "pci_bus_id": g.pci or "", "uuid": g.uuid or "",
                "model_name": g.name or "", "serial": g.serial or "", "vbios_version": g.vbios or "",
                "driver_version": snap.driver_version or ""}, 1) for g in snap.gpus])
    gauges = (("gpufleet_gpu_temperature_celsius", "GPU temperature.", "temperature"),
              ("gpufleet_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature.", "memory_temperature"),
              ("gpufleet_gpu_power_draw_watts", "GPU power draw.", "power_draw"),
              ("gpufleet_gpu_power_limit_watts", "Enforced GPU power limit.", "power_limit"),
              ("gpufleet_gpu_ecc_volatile_uncorrected_errors", "Uncorrectable ECC errors since the last reset.",
               "ecc_volatile_dbe"),
              ("gpufleet_gpu_ecc_volatile_corrected_errors", "Correctable ECC errors since the last reset.",
               "ecc_volatile_sbe"),
              ("gpufleet_gpu_ecc_aggregate_uncorrected_errors", "Uncorrectable ECC errors over the GPU's life.",
               "ecc_aggregate_dbe"),
              ("gpufleet_gpu_remapped_rows_pending", "1 when a row remap waits for a GPU reset.",
               "remapped_rows_pending"),
              ("gpufleet_gpu_remapped_rows_failure", "1 when a row remap failed (the GPU needs replacing).",
               "remapped_rows_failure"),
              ("gpufleet_gpu_retired_pages_pending", "1 when a page retirement waits for a reboot (pre-Ampere).",
               "retired_pages_pending"),
              ("gpufleet_gpu_recovery_action", "NVML GPU recovery action (0 none .. 7).", "recovery_action"),
              ("gpufleet_gpu_lost", "1 when the GPU is lost.", "lost"))
    for name, help_, attr in gauges:
        w.metric(name, help_, "gauge", [(_gpu_labels(node, g), getattr(g, attr)) for g in snap.gpus])
    rows = []
    pages = []
    for g in snap.gpus:
        rows += [(dict(_gpu_labels(node, g), kind="correctable"), g.remapped_rows_correctable),
                 (dict(_gpu_labels(node, g), kind="uncorrectable"), g.remapped_rows_uncorrectable)]
        pages += [(dict(_gpu_labels(node, g), cause="sbe"), g.retired_pages_sbe),
                  (dict(_gpu_labels(node, g), cause="dbe"), g.retired_pages_dbe)]
    w.metric("gpufleet_gpu_remapped_rows", "Rows remapped by the GPU's memory row remapper (Ampere and later).",
             "gauge", rows)
    w.metric("gpufleet_gpu_retired_pages", "Framebuffer pages retired by ECC cause (pre-Ampere).", "gauge", pages)
    w.metric("gpufleet_gpu_pcie_replays_total", "PCIe replays since the driver loaded.", "counter",
             [(_gpu_labels(node, g), g.pcie_replay_counter) for g in snap.gpus])
    reasons = []
    reason_time = []
    for g in snap.gpus:
        if isinstance(g.clocks_event_reasons, (list, tuple)):
            active = {r for r in g.clocks_event_reasons if isinstance(r, str)}
            reasons += [(dict(_gpu_labels(node, g), reason=r), int(r in active)) for r in CLOCK_REASON_BITS]
        counters_us = g.clocks_event_counters_us if isinstance(g.clocks_event_counters_us, Mapping) else {}
        for r, us in sorted(counters_us.items(), key=lambda kv: str(kv[0])):
            if num(us) is not None and us >= 0:
                reason_time.append((dict(_gpu_labels(node, g), reason=r), us / 1e6))
    w.metric("gpufleet_gpu_clocks_event_reason", "1 when this clocks-event (throttle) reason is active now.",
             "gauge", reasons)
    w.metric("gpufleet_gpu_clocks_event_duration_seconds_total", "Time the GPU spent with this clocks-event "
             "reason active, as the driver counts it.", "counter", reason_time)
    links = []
    errors = []
    for g in snap.gpus:
        if not isinstance(g.nvlinks, (list, tuple)):
            continue
        nvlinks = [link for link in g.nvlinks if isinstance(link, NvLinkInfo)]
        known = [link.active for link in nvlinks if isinstance(link.active, bool)]
        if known:
            links += [(dict(_gpu_labels(node, g), state="up"), sum(1 for a in known if a)),
                      (dict(_gpu_labels(node, g), state="down"), sum(1 for a in known if not a))]
        for kind in NVLINK_COUNTERS:
            values = [getattr(link, f"{kind}_errors") for link in nvlinks]
            values = [v for v in values if num(v) is not None]
            if values:
                errors.append((dict(_gpu_labels(node, g), type=kind), sum(values)))
    w.metric("gpufleet_gpu_nvlink_links", "NVLink links of the GPU by state (up = active).", "gauge", links)
    w.metric("gpufleet_gpu_nvlink_errors_total", "NVLink error counters by type (replay, recovery, CRC flit, "
             "CRC data), summed over the GPU's links.", "counter",
             errors)
    w.metric("gpufleet_gpu_probe_errors", "Probe calls that failed for this GPU in the last check "
             "(not counting unsupported ones).", "gauge",
             [(_gpu_labels(node, g), len(g.probe_errors)) for g in snap.gpus if isinstance(g.probe_errors, Mapping)])


def _counters(w: Writer, node: str, snap: Optional[Snapshot], counters: Mapping[str, Any]) -> None:
    n = {"node": node}
    w.metric("gpufleet_health_checks_total", "Checks run since the state file was created.", "counter",
             [(n, counters.get("checks"))])
    probe = _count_map(counters.get("probe_failures"))
    w.metric("gpufleet_health_probe_failures_total", "GPU probes that timed out or failed, by status.", "counter",
             [({"node": node, "status": s}, probe.get(s, 0)) for s in (PROBE_TIMEOUT, PROBE_FAILED)])
    gpu_of = {g.pci: g.index for g in (snap.gpus if snap is not None else []) if g.pci}
    xid = []
    for key, count in sorted(_count_map(counters.get("xid")).items()):
        pci, _sep, code = key.partition("|")
        xid.append(({"node": node, "gpu": gpu_of.get(pci, ""), "pci_bus_id": pci, "xid": code}, count))
    w.metric(XID_METRIC, "Xid events in the kernel log by GPU and code since the state file "
             "was created.", "counter", xid, always=True)
    last_seen = counters.get("xid_last")
    last = last_seen if isinstance(last_seen, Mapping) else {}
    w.metric("gpufleet_gpu_xid_last", "Code of the last Xid seen for this GPU (as DCGM_FI_DEV_XID_ERRORS).", "gauge",
             [({"node": node, "gpu": gpu_of.get(pci, ""), "pci_bus_id": pci}, code)
              for pci, code in sorted(last.items())])
