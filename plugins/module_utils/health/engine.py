# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""judge(): snapshot + kernel lines + config + previous state -> Report (and the next state)."""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from .catalog import Catalog
from .config import Config
from .kmsg_parse import parse_kmsg
from .model import KernelEvent, Snapshot
from .profiles import GpuProfile, build_profiles, profile_for
from .report import Report
from .rules import (
    Ctx,
    check_driver,
    check_events,
    check_gpu,
    check_gpu_count,
    check_node,
    check_node_throttle,
    check_probe,
    node_throttle_set,
)

_MAX_REMEMBERED = 300
_DEFAULT_CATALOG = None
_DEFAULT_PROFILES = None


def _catalog(cfg: Config) -> Catalog:
    global _DEFAULT_CATALOG
    if cfg.xid_overrides or cfg.sxid_overrides:
        return Catalog(cfg.xid_overrides, cfg.sxid_overrides)
    if _DEFAULT_CATALOG is None:
        _DEFAULT_CATALOG = Catalog()
    return _DEFAULT_CATALOG


def _profiles(cfg: Config) -> Dict[str, GpuProfile]:
    global _DEFAULT_PROFILES
    if cfg.profiles:
        return build_profiles(cfg.profiles)
    if _DEFAULT_PROFILES is None:
        _DEFAULT_PROFILES = build_profiles()
    return _DEFAULT_PROFILES


def _event_from_state(d: Mapping[str, Any]) -> Optional[KernelEvent]:
    try:
        fields = {k: d[k] for k in KernelEvent.__dataclass_fields__ if k in d}
        return KernelEvent(**fields)
    except (TypeError, KeyError):
        return None


def _repaired_at(stored: Any, given: Any, now: float) -> Optional[float]:
    """The newest repair time, never later than now: the state's (ignored unless a finite number) and the
    caller's (checked)."""
    def ok(t: Any) -> bool:
        return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0

    if given is not None and not ok(given):
        raise ValueError(f"repaired_at: expected epoch seconds (a finite number >= 0), got {given!r}")
    times = [float(t) for t in (stored, given) if ok(t)]
    return min(max(times), now) if times else None


def _events_in_view(cfg: Config, catalog: Catalog, prev: Mapping[str, Any], events: List[KernelEvent], now: float,
                    repaired: Optional[float]) -> Tuple[List[KernelEvent], List[Dict[str, Any]]]:
    """The kernel events to judge and the ones to remember: this run's merged with those the previous state kept
    (sticky windows survive the kmsg cursor moving on), each inside its window (sticky or not) and after the last
    repair. Returns (in view, to keep in the next state)."""
    first_seen: Dict[str, float] = {}
    merged: Dict[str, KernelEvent] = {}
    for d in prev.get("events") or []:
        if isinstance(d, Mapping):
            ev = _event_from_state(d)
            if ev is not None:
                merged[ev.ident] = ev
                first_seen[ev.ident] = float(d.get("first_seen") or now)
    for ev in events:
        ident = ev.ident
        if ident not in merged:
            merged[ident] = ev
            first_seen[ident] = now
    all_events = list(merged.values())
    ref = now
    if cfg.events_as_of == "latest":
        dated = [e.wallclock for e in all_events if e.wallclock is not None]
        if dated:
            ref = max(dated)
    in_view: List[KernelEvent] = []
    keep: List[Dict[str, Any]] = []
    for ev in all_events:
        if ev.kind not in ("xid", "fallen_off_bus", "sxid", "rate_limit", "gpu_uuid"):
            continue
        if ev.kind == "sxid":
            entry = catalog.sxid(ev.xid or 0, True if ev.severity == "Fatal" else
                                 (False if ev.severity == "Non-fatal" else None))
        elif ev.kind in ("xid", "fallen_off_bus"):
            entry = catalog.xid(ev.xid or 0)
        else:
            entry = None
        window = cfg.t["sticky_window_s"] if entry is not None and entry.sticky else cfg.t["event_window_s"]
        t_ev = ev.wallclock if ev.wallclock is not None else first_seen.get(ev.ident, now)
        if ref - t_ev > window or (repaired is not None and t_ev <= repaired):
            continue
        in_view.append(ev)
        if entry is not None and (entry.sticky or entry.severity != "info" or ev.xid == 154 or
                                  ev.severity == "Fatal"):
            d = ev.to_dict()
            d["first_seen"] = first_seen.get(ev.ident, now)
            keep.append(d)
    return in_view, keep


def judge(snapshot: Union[None, Snapshot, Mapping[str, Any]] = None,
          kmsg_lines: Union[None, str, bytes, Iterable[Union[str, bytes, KernelEvent]]] = (),
          config: Union[None, Config, Mapping[str, Any]] = None,
          state: Optional[Mapping[str, Any]] = None,
          now: Optional[float] = None, repaired_at: Optional[float] = None) -> Report:
    """Judge one node.

    snapshot: Snapshot, its dict form, or None (kernel log only). kmsg_lines: text, lines or KernelEvent objects;
    None means "no kernel log either" (with no snapshot that is the verdict unknown, code no_data).
    config: mapping (see config.py) or Config. state: the previous run's ``report.state`` (not modified), or None
    (the first run). now: epoch seconds, required: the brain reads no clock and no file (the bodies read the state
    file and the clock, and write ``report.state`` back; ``statefile.py``).
    repaired_at: epoch seconds when a repair step (GPU reset, reboot) started whose verification this check is:
    kernel events dated at or before it are what the repair fixed, so they are neither judged nor remembered, now
    or in later runs (the state keeps the newest such time). The next state is in ``report.state``.
    """
    cfg = config if isinstance(config, Config) else Config(config)
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ValueError(f"now: expected epoch seconds (a finite number), got {now!r}")
    now = float(now)
    if isinstance(snapshot, Mapping):
        snapshot = Snapshot.from_dict(dict(snapshot))
    elif snapshot is not None and not isinstance(snapshot, Snapshot):
        raise ValueError(f"snapshot: expected a Snapshot or a mapping, got {type(snapshot).__name__}")
    if isinstance(state, Mapping):
        prev: Dict[str, Any] = dict(state)
    elif state is None:
        prev = {}
    else:
        raise ValueError(f"state: expected a mapping (the previous report.state) or None, got {type(state).__name__}")

    repaired = _repaired_at(prev.get("repaired_at"), repaired_at, now)
    catalog = _catalog(cfg)
    profiles = _profiles(cfg)
    ctx = Ctx(cfg, catalog, now, prev)
    ctx.new_state_probe_timeouts = 0

    events = parse_kmsg(kmsg_lines, boot_time=cfg.boot_time) if kmsg_lines else []
    have_kmsg = kmsg_lines is not None  # () / [] = "the kernel log was read and is empty"; None = "not read"

    in_view, keep = _events_in_view(cfg, catalog, prev, events, now, repaired)

    pci_to_gpu = {}
    prof_by_gpu = {}
    if snapshot is not None:
        for g in snapshot.gpus:
            if g.pci:
                pci_to_gpu[g.pci] = g
            prof_by_gpu[g.index] = profile_for(g.name, profiles, cfg.profile)

    if cfg.on("probe"):
        check_probe(ctx, snapshot, have_kmsg)
    if snapshot is not None:
        nt = node_throttle_set(snapshot) if cfg.on("clocks") else set()
        for g in snapshot.gpus:
            check_gpu(ctx, snapshot, g, prof_by_gpu.get(g.index), nt)
        check_node_throttle(ctx, snapshot, nt)
        if cfg.on("gpu_count"):
            check_gpu_count(ctx, snapshot)
        if cfg.on("driver"):
            check_driver(ctx, snapshot)
        check_node(ctx, snapshot)
    else:
        ctx.skipped.append("gpu checks (no snapshot)")
    check_events(ctx, in_view, pci_to_gpu, prof_by_gpu)

    new_state: Dict[str, Any] = {
        "updated": now,
        "gpus": ctx.new_gpus if snapshot is not None else (prev.get("gpus") or {}),
        "events": keep[-_MAX_REMEMBERED:],
        "probe_timeouts": ctx.new_state_probe_timeouts,
    }
    if repaired is not None:
        new_state["repaired_at"] = repaired
    report = Report(findings=ctx.findings, hostname=cfg.hostname or (snapshot.hostname if snapshot else None),
                    checked_at=now, skipped=ctx.skipped, state=new_state)
    return report
