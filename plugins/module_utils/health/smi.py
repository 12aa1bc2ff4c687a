# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Readers for ``nvidia-smi -q -x`` (XML) and ``nvidia-smi -q`` (text) captures -> Snapshot.

Both readers first reduce a GPU's section to canonical keys with raw strings, then one converter turns the
strings into typed fields. Values that read ``N/A``, ``Not Supported``, ``Requested functionality has been
deprecated`` or similar become ``None`` (skip, never fail); ``GPU is lost`` / ``Unknown Error`` bodies mark the
GPU lost. Neither reader raises on arbitrary input: unparseable input gives a snapshot with
``probe_status = "failed"``.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .model import (
    PROBE_FAILED,
    PROBE_OK,
    PROBE_PARTIAL,
    GpuSnapshot,
    Snapshot,
    ascii_re,
)

_NA = ("n/a", "[n/a]", "not supported", "[not supported]", "requested functionality has been deprecated",
       "not available", "unknown", "none", "")
_LOST_MARKERS = ("gpu is lost", "unknown error", "gpu requires reset")
_NUM_RE = ascii_re(r"[-+]?\d+(?:\.\d+)?")

_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
            "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clocks_setting")
_COUNTER_XML = {
    "sw_power_cap": "sw_power_cap", "sync_boost": "sync_boost", "sw_therm_slowdown": "sw_thermal_slowdown",
    "hw_therm_slowdown": "hw_thermal_slowdown", "hw_power_brake": "hw_power_brake_slowdown",
}


# ---------------------------------------------------------------- value helpers
def _is_lost(v: Optional[str]) -> bool:
    return v is not None and v.strip().lower() in _LOST_MARKERS


def _clean(v: Optional[str]) -> Optional[str]:
    if v is None:
        return None
    v = v.strip()
    if v.lower() in _NA or _is_lost(v):
        return None
    return v


def _num(v: Optional[str]) -> Optional[float]:
    v = _clean(v)
    if v is None:
        return None
    m = _NUM_RE.search(v.replace(",", ""))
    if not m:
        return None
    try:
        return float(m.group(0))
    except ValueError:  # pragma: no cover
        return None


def _int(v: Optional[str]) -> Optional[int]:
    v2 = _clean(v)
    if v2 is None:
        return None
    if v2.lower().startswith("0x"):
        word = v2.split()[0]
        if len(word) > 18:  # more than 64 bits: no NVML field is that wide (a hostile or damaged value)
            return None
        try:
            return int(word, 16)
        except ValueError:
            return None
    n = _num(v2)
    if n is None or abs(n) > 1e18:
        return None
    return int(n)


def _bool(v: Optional[str]) -> Optional[bool]:
    v = _clean(v)
    if v is None:
        return None
    low = v.lower()
    if low in ("yes", "enabled", "active", "true", "1", "on"):
        return True
    if low in ("no", "disabled", "not active", "false", "0", "off"):
        return False
    return None


def _recovery(v: Optional[str]) -> Optional[int]:
    raw = (v or "").strip().lower()
    if raw == "none":
        return 0
    v = _clean(v)
    if v is None:
        return None
    low = v.lower()
    if low.startswith("0x") or low.isdigit():
        return _int(v)
    for needle, code in (("drain and reset", 4), ("drain p2p", 3), ("imex", 5), ("bus reset", 6),
                         ("system reboot", 7), ("node reboot", 2), ("reboot", 2), ("reset", 1)):
        if needle in low:
            return code
    return None


def _sum(values: Iterable[Optional[int]]) -> Optional[int]:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _build_gpu(index: int, raw: Dict[str, str], lost: bool,
               lost_where: Optional[List[Tuple[str, str]]] = None) -> GpuSnapshot:
    g = GpuSnapshot(index=index)
    g.lost = lost
    g.name = _clean(raw.get("name"))
    g.architecture = _clean(raw.get("arch"))
    g.uuid = _clean(raw.get("uuid"))
    g.serial = _clean(raw.get("serial"))
    g.vbios = _clean(raw.get("vbios"))
    g.pci_bus_id = _clean(raw.get("pci"))
    g.persistence_mode = _bool(raw.get("persistence"))
    g.mig_enabled = _bool(raw.get("mig_current"))
    g.reset_required = _bool(raw.get("reset_required"))
    g.drain_and_reset_recommended = _bool(raw.get("drain_and_reset"))
    g.recovery_action = _recovery(raw.get("recovery_action")) if "recovery_action" in raw else None
    g.pcie_gen_max = _int(raw.get("pcie_gen_max"))
    g.pcie_gen_current = _int(raw.get("pcie_gen_cur"))
    g.pcie_width_max = _int(raw.get("pcie_width_max"))
    g.pcie_width_current = _int(raw.get("pcie_width_cur"))
    g.pcie_replay_counter = _int(raw.get("replay"))
    reasons = [r for r in _REASONS if _bool(raw.get("reason:" + r))]
    g.clocks_event_reasons = reasons if any(("reason:" + r) in raw for r in _REASONS) else None
    g.clocks_event_counters_us = {k[8:]: v for k, v in ((k, _int(val)) for k, val in raw.items()
                                                        if k.startswith("counter:")) if v is not None}
    g.ecc_enabled = _bool(raw.get("ecc_cur"))
    g.ecc_pending_enabled = _bool(raw.get("ecc_pend"))
    for scope, attr_sbe, attr_dbe in (("vol", "ecc_volatile_sbe", "ecc_volatile_dbe"),
                                      ("agg", "ecc_aggregate_sbe", "ecc_aggregate_dbe")):
        sbe = _sum(_int(raw.get(f"{scope}:{k}")) for k in ("sram_correctable", "dram_correctable",
                                                           "single_bit_total"))
        dbe = _sum(_int(raw.get(f"{scope}:{k}")) for k in ("sram_uncorrectable_parity", "sram_uncorrectable_secded",
                                                           "sram_uncorrectable", "dram_uncorrectable",
                                                           "double_bit_total"))
        setattr(g, attr_sbe, sbe)
        setattr(g, attr_dbe, dbe)
    g.sram_threshold_exceeded = _bool(raw.get("sram_threshold"))
    g.retired_pages_sbe = _int(raw.get("retired_sbe"))
    g.retired_pages_dbe = _int(raw.get("retired_dbe"))
    g.retired_pages_pending = _bool(raw.get("retired_pending"))
    g.remapped_rows_correctable = _int(raw.get("rr_corr"))
    g.remapped_rows_uncorrectable = _int(raw.get("rr_unc"))
    g.remapped_rows_pending = _bool(raw.get("rr_pending"))
    g.remapped_rows_failure = _bool(raw.get("rr_failure"))
    g.temperature = _num(raw.get("temp"))
    g.temp_tlimit = _num(raw.get("temp_tlimit"))
    g.temp_shutdown = _num(raw.get("temp_shutdown"))
    g.temp_slowdown = _num(raw.get("temp_slowdown"))
    g.temp_shutdown_tlimit = _num(raw.get("temp_shutdown_tlimit"))
    g.temp_slowdown_tlimit = _num(raw.get("temp_slowdown_tlimit"))
    g.memory_temperature = _num(raw.get("mem_temp"))
    g.memory_temp_max = _num(raw.get("mem_temp_max"))
    g.power_draw = _num(raw.get("power_draw")) if _num(raw.get("power_draw")) is not None else _num(
        raw.get("power_draw_avg"))
    g.power_limit = _num(raw.get("power_limit"))
    g.power_default_limit = _num(raw.get("power_default"))
    g.power_max_limit = _num(raw.get("power_max"))
    g.utilization_gpu = _num(raw.get("util_gpu"))
    g.performance_state = _clean(raw.get("pstate"))
    g.fabric_state = _clean(raw.get("fabric_state"))
    g.fabric_status = _clean(raw.get("fabric_status"))
    g.fabric_health = {k[14:]: v for k, v in ((k, _clean(val)) for k, val in raw.items()
                                              if k.startswith("fabric_health:")) if v is not None}
    if lost_where:
        g.lost = True
        g.probe_errors.update(dict(lost_where[:8]))
    else:
        lost_fields = sorted(k for k, v in raw.items() if _is_lost(v))
        if lost_fields:
            g.lost = True
            g.probe_errors.update({k: raw[k].strip() for k in lost_fields[:8]})
    return g


def _xml_lost_where(el: ET.Element, prefix: str = "") -> List[Tuple[str, str]]:
    """(element path, text) of every element of a GPU whose body says the GPU is lost, in document order."""
    out: List[Tuple[str, str]] = []
    for child in el:
        path = f"{prefix}{child.tag}"
        if child.text and _is_lost(child.text):
            out.append((f"nvidia-smi {path}", child.text.strip()))
        if len(child):
            out.extend(_xml_lost_where(child, path + "/"))
    return out


# ---------------------------------------------------------------- XML
_XML_MAP = {
    "product_name": "name", "product_architecture": "arch", "uuid": "uuid", "serial": "serial",
    "vbios_version": "vbios", "persistence_mode": "persistence", "mig_mode/current_mig": "mig_current",
    "gpu_reset_status/reset_required": "reset_required",
    "gpu_reset_status/drain_and_reset_recommended": "drain_and_reset",
    "gpu_recovery_action": "recovery_action", "pci/pci_bus_id": "pci",
    "pci/pci_gpu_link_info/pcie_gen/max_link_gen": "pcie_gen_max",
    "pci/pci_gpu_link_info/pcie_gen/current_link_gen": "pcie_gen_cur",
    "pci/pci_gpu_link_info/link_widths/max_link_width": "pcie_width_max",
    "pci/pci_gpu_link_info/link_widths/current_link_width": "pcie_width_cur",
    "pci/replay_counter": "replay", "ecc_mode/current_ecc": "ecc_cur", "ecc_mode/pending_ecc": "ecc_pend",
    "ecc_errors/aggregate/sram_threshold_exceeded": "sram_threshold",
    "retired_pages/multiple_single_bit_retirement/retired_count": "retired_sbe",
    "retired_pages/double_bit_retirement/retired_count": "retired_dbe",
    "retired_pages/pending_retirement": "retired_pending",
    "remapped_rows/remapped_row_corr": "rr_corr", "remapped_rows/remapped_row_unc": "rr_unc",
    "remapped_rows/remapped_row_pending": "rr_pending", "remapped_rows/remapped_row_failure": "rr_failure",
    "remapped_rows": "rr_section",
    "temperature/gpu_temp": "temp", "temperature/gpu_temp_tlimit": "temp_tlimit",
    "temperature/gpu_temp_max_threshold": "temp_shutdown", "temperature/gpu_temp_slow_threshold": "temp_slowdown",
    "temperature/gpu_temp_max_tlimit_threshold": "temp_shutdown_tlimit",
    "temperature/gpu_temp_slow_tlimit_threshold": "temp_slowdown_tlimit",
    "temperature/memory_temp": "mem_temp", "temperature/gpu_temp_max_mem_threshold": "mem_temp_max",
    "utilization/gpu_util": "util_gpu", "performance_state": "pstate",
    "fabric/state": "fabric_state", "fabric/status": "fabric_status",
}
_XML_POWER = {"instant_power_draw": "power_draw", "power_draw": "power_draw", "average_power_draw": "power_draw_avg",
              "current_power_limit": "power_limit", "enforced_power_limit": "power_limit",
              "default_power_limit": "power_default", "max_power_limit": "power_max"}


def _text(el: Optional[ET.Element]) -> str:
    return "".join(el.itertext()).strip() if el is not None else ""


def _xml_gpu(gpu_el: ET.Element) -> Tuple[Dict[str, str], List[Tuple[str, str]]]:
    raw: Dict[str, str] = {}
    for path, key in _XML_MAP.items():
        el = gpu_el.find(path)
        if el is not None:
            raw[key] = _text(el) if len(el) == 0 else ("GPU is lost" if _is_lost(el.text) else "")
    pci_id = gpu_el.get("id")
    if "pci" not in raw and pci_id:
        raw["pci"] = pci_id
    power = gpu_el.find("gpu_power_readings")
    if power is None:
        power = gpu_el.find("power_readings")
    if power is not None:
        for child in power:
            power_key = _XML_POWER.get(child.tag)
            if power_key and power_key not in raw:
                raw[power_key] = _text(child)
    for parent in ("clocks_event_reasons", "clocks_throttle_reasons"):
        el = gpu_el.find(parent)
        if el is None:
            continue
        for child in el:
            for prefix in ("clocks_event_reason_", "clocks_throttle_reason_"):
                if child.tag.startswith(prefix):
                    name = child.tag[len(prefix):]
                    name = {"hw_thermal_slowdown": "hw_thermal_slowdown", "idle": "gpu_idle",
                            "display_clock_setting": "display_clocks_setting"}.get(name, name)
                    raw["reason:" + name] = _text(child)
        break
    el = gpu_el.find("clocks_event_reasons_counters")
    if el is not None:
        for child in el:
            name = child.tag.replace("clocks_event_reasons_counters_", "")
            if name in _COUNTER_XML:
                raw["counter:" + _COUNTER_XML[name]] = _text(child)
    for scope, tag in (("vol", "volatile"), ("agg", "aggregate")):
        el = gpu_el.find("ecc_errors/" + tag)
        if el is None:
            continue
        for child in el:
            if len(child):  # old layout: single_bit/total, double_bit/total
                tot = child.find("total")
                if tot is not None:
                    raw[f"{scope}:{child.tag}_total"] = _text(tot)
            elif child.tag != "sram_threshold_exceeded":
                raw[f"{scope}:{child.tag}"] = _text(child)
    el = gpu_el.find("fabric/health")
    if el is not None:
        for child in el:
            raw["fabric_health:" + child.tag] = _text(child)
    lost_where = _xml_lost_where(gpu_el)
    return raw, lost_where


def read_nvidia_smi_xml(text: Any) -> Snapshot:
    """Parse ``nvidia-smi -q -x`` output (str or bytes). Never raises on bad input."""
    snap = Snapshot(source="nvidia-smi-xml")
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        snap.probe_status, snap.probe_error = PROBE_FAILED, f"expected XML text, got {type(text).__name__}"
        return snap
    # The DOCTYPE names an external DTD that is never fetched; drop it so expat does not look for it.
    body = re.sub(r"<!DOCTYPE[^>]*>", "", text, count=1)
    try:
        root = ET.fromstring(body)
    except (ET.ParseError, ValueError) as exc:
        failure = _text_failure(text)
        if failure is not None:
            return failure
        snap.probe_status, snap.probe_error = PROBE_FAILED, f"nvidia-smi XML does not parse: {exc}"
        return snap
    if root.tag != "nvidia_smi_log":
        snap.probe_status = PROBE_FAILED
        snap.probe_error = f"nvidia-smi XML: root element is <{root.tag[:40]}>, expected <nvidia_smi_log>"
        return snap
    snap.driver_version = _clean(_text(root.find("driver_version")))
    snap.cuda_version = _clean(_text(root.find("cuda_version")))
    snap.attached_gpus = _int(_text(root.find("attached_gpus")))
    for i, gpu_el in enumerate(root.findall("gpu")):
        raw, lost_where = _xml_gpu(gpu_el)
        snap.gpus.append(_build_gpu(i, raw, bool(lost_where), lost_where))
    _finish(snap)
    return snap


# ---------------------------------------------------------------- text
_TEXT_TOP = {
    ("Product Name",): "name", ("Product Architecture",): "arch", ("GPU UUID",): "uuid",
    ("Serial Number",): "serial", ("VBIOS Version",): "vbios", ("Persistence Mode",): "persistence",
    ("MIG Mode", "Current"): "mig_current", ("GPU Reset Status", "Reset Required"): "reset_required",
    ("GPU Reset Status", "Drain and Reset Recommended"): "drain_and_reset",
    ("GPU Recovery Action",): "recovery_action", ("PCI", "Bus Id"): "pci",
    ("PCI", "GPU Link Info", "PCIe Generation", "Max"): "pcie_gen_max",
    ("PCI", "GPU Link Info", "PCIe Generation", "Current"): "pcie_gen_cur",
    ("PCI", "GPU Link Info", "Link Width", "Max"): "pcie_width_max",
    ("PCI", "GPU Link Info", "Link Width", "Current"): "pcie_width_cur",
    ("PCI", "Replays Since Reset"): "replay", ("ECC Mode", "Current"): "ecc_cur",
    ("ECC Mode", "Pending"): "ecc_pend",
    ("ECC Errors", "Aggregate", "SRAM Threshold Exceeded"): "sram_threshold",
    ("Retired Pages", "Single Bit ECC"): "retired_sbe", ("Retired Pages", "Double Bit ECC"): "retired_dbe",
    ("Retired Pages", "Pending Page Blacklist"): "retired_pending",
    ("Retired Pages", "Pending Page Retirement"): "retired_pending",
    ("Remapped Rows",): "rr_section",
    ("Remapped Rows", "Correctable Error"): "rr_corr", ("Remapped Rows", "Uncorrectable Error"): "rr_unc",
    ("Remapped Rows", "Pending"): "rr_pending", ("Remapped Rows", "Remapping Failure Occurred"): "rr_failure",
    ("Temperature", "GPU Current Temp"): "temp", ("Temperature", "GPU T.Limit Temp"): "temp_tlimit",
    ("Temperature", "GPU Shutdown Temp"): "temp_shutdown", ("Temperature", "GPU Slowdown Temp"): "temp_slowdown",
    ("Temperature", "GPU Shutdown T.Limit Temp"): "temp_shutdown_tlimit",
    ("Temperature", "GPU Slowdown T.Limit Temp"): "temp_slowdown_tlimit",
    ("Temperature", "Memory Current Temp"): "mem_temp", ("Temperature", "Memory Max Operating Temp"): "mem_temp_max",
    ("Utilization", "Gpu"): "util_gpu", ("Performance State",): "pstate",
    ("Fabric", "State"): "fabric_state", ("Fabric", "Status"): "fabric_status",
}
for _sec in ("GPU Power Readings", "Power Readings"):
    for _k, _v in (("Power Draw", "power_draw"), ("Instantaneous Power Draw", "power_draw"),
                   ("Average Power Draw", "power_draw_avg"), ("Current Power Limit", "power_limit"),
                   ("Enforced Power Limit", "power_limit"), ("Default Power Limit", "power_default"),
                   ("Max Power Limit", "power_max")):
        _TEXT_TOP[(_sec, _k)] = _v
_TEXT_REASON = {"Idle": "gpu_idle", "GPU Idle": "gpu_idle",
                "Applications Clocks Setting": "applications_clocks_setting",
                "SW Power Cap": "sw_power_cap", "HW Slowdown": "hw_slowdown", "HW Thermal Slowdown":
                "hw_thermal_slowdown", "HW Power Brake Slowdown": "hw_power_brake_slowdown", "Sync Boost":
                "sync_boost", "SW Thermal Slowdown": "sw_thermal_slowdown", "Display Clock Setting":
                "display_clocks_setting"}
_TEXT_ECC = {"SRAM Correctable": "sram_correctable", "SRAM Uncorrectable Parity": "sram_uncorrectable_parity",
             "SRAM Uncorrectable SEC-DED": "sram_uncorrectable_secded", "SRAM Uncorrectable": "sram_uncorrectable",
             "DRAM Correctable": "dram_correctable", "DRAM Uncorrectable": "dram_uncorrectable"}
_GPU_HDR_RE = ascii_re(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
# greedy key, stripped after the match: a lazy key followed by \s* and $ backtracked quadratically on a long
# line without a colon (a 32 KiB line took seconds)
_KV_RE = ascii_re(r"^( *)(\S[^:]*)(?::\s?(.*))?$")
_HANDLE_RE = ascii_re(r"Unable to determine the device handle for GPU ?(?P<pci>[0-9A-Fa-f:.]+): (?P<err>.*)")


def _text_gpu(lines: List[str], pci: str) -> Tuple[Dict[str, str], List[Tuple[str, str]]]:
    raw: Dict[str, str] = {"pci": pci}
    stack: List[Tuple[int, str]] = []
    lost_where: List[Tuple[str, str]] = []
    for line in lines:
        if not line.strip():
            continue
        m = _KV_RE.match(line)
        if not m:
            continue
        indent, key, value = len(m.group(1)), m.group(2).strip(), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(k for _indent, k in stack) + (key,)
        stack.append((indent, key))
        if value is None:
            continue
        if _is_lost(value):
            lost_where.append(("nvidia-smi " + " > ".join(path), value.strip()))
        canon = _TEXT_TOP.get(path)
        if canon:
            raw.setdefault(canon, value)
            continue
        if path and path[0] in ("Clocks Event Reasons", "Clocks Throttle Reasons") and key in _TEXT_REASON:
            raw["reason:" + _TEXT_REASON[key]] = value
        elif len(path) == 3 and path[0] == "ECC Errors" and path[1] in ("Volatile", "Aggregate") and key in _TEXT_ECC:
            raw[("vol:" if path[1] == "Volatile" else "agg:") + _TEXT_ECC[key]] = value
        elif len(path) == 4 and path[0] == "ECC Errors" and path[3] == "Total":
            scope = "vol:" if path[1] == "Volatile" else "agg:"
            raw[scope + ("single_bit_total" if "Single" in path[2] else "double_bit_total")] = value
    return raw, lost_where


def _text_failure(text: str) -> Optional[Snapshot]:
    """Snapshot for nvidia-smi / NVML failure text (no GPU sections), or None if the text is not one."""
    snap = Snapshot(source="nvidia-smi-text")
    found = False
    for line in text.splitlines():
        if "Failed to initialize NVML" in line or "NVML: Driver/library version mismatch" in line:
            snap.probe_status, snap.probe_error = PROBE_FAILED, line.strip()[:300]
            low = line.lower()
            snap.probe_error_code = 18 if "mismatch" in low else (9 if "driver not loaded" in low else None)
            found = True
        elif "NVIDIA-SMI has failed" in line or "couldn't communicate with the NVIDIA driver" in line:
            snap.probe_status, snap.probe_error, snap.probe_error_code = PROBE_FAILED, line.strip()[:300], 9
            found = True
        else:
            m = _HANDLE_RE.search(line)
            if m or ("GPU is lost" in line and ("NVML" in line or "NVMLError" in line)):
                g = GpuSnapshot(index=len(snap.gpus), pci_bus_id=m.group("pci") if m else None, lost=True)
                g.probe_errors["handle"] = line.strip()[:300]
                snap.gpus.append(g)
                if snap.probe_status == PROBE_OK:
                    snap.probe_status = PROBE_PARTIAL
                found = True
            elif "NVMLError_Unknown" in line:
                g = GpuSnapshot(index=len(snap.gpus), lost=True, probe_errors={"handle": line.strip()[:300]})
                snap.gpus.append(g)
                snap.probe_status = PROBE_PARTIAL if snap.probe_status == PROBE_OK else snap.probe_status
                found = True
            elif line.strip() == "No devices were found":
                snap.attached_gpus = 0
                found = True
    return snap if found else None


def read_nvidia_smi_text(text: Any) -> Snapshot:
    """Parse plain-text ``nvidia-smi -q`` output (or nvidia-smi / NVML failure text). Never raises."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return Snapshot(source="nvidia-smi-text", probe_status=PROBE_FAILED,
                        probe_error=f"expected text, got {type(text).__name__}")
    lines = text.splitlines()
    snap = Snapshot(source="nvidia-smi-text")
    sections: List[Tuple[str, List[str]]] = []
    header: Dict[str, str] = {}
    cur: Optional[List[str]] = None
    for line in lines:
        m = _GPU_HDR_RE.match(line)
        if m:
            cur = []
            sections.append((m.group(1), cur))
            continue
        if cur is not None and line[:1] in (" ", "\t"):
            cur.append(line)
        else:
            cur = None
            km = _KV_RE.match(line)
            if km and km.group(3) is not None and not km.group(1):
                header[km.group(2).strip()] = km.group(3)
    if not sections:
        failure = _text_failure(text)
        if failure is not None:
            return failure
        snap.probe_status = PROBE_FAILED
        snap.probe_error = "no GPU section in nvidia-smi output"
        if "NVSMI LOG" in text:
            snap.attached_gpus = _int(header.get("Attached GPUs"))
            if snap.attached_gpus == 0:
                snap.probe_status, snap.probe_error = PROBE_OK, None
        return snap
    snap.driver_version = _clean(header.get("Driver Version"))
    snap.cuda_version = _clean(header.get("CUDA Version"))
    snap.attached_gpus = _int(header.get("Attached GPUs"))
    for i, (pci, body) in enumerate(sections):
        raw, lost_where = _text_gpu(body, pci)
        snap.gpus.append(_build_gpu(i, raw, bool(lost_where), lost_where))
    extra = _text_failure(text)
    if extra is not None:
        for g in extra.gpus:
            g.index = len(snap.gpus)
            snap.gpus.append(g)
    _finish(snap)
    return snap


def _finish(snap: Snapshot) -> None:
    if any(g.lost for g in snap.gpus) and snap.probe_status == PROBE_OK:
        snap.probe_status = PROBE_PARTIAL
