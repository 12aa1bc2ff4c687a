# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Telemetry snapshot model: what one probe of one node saw.

Every field that a source could not read (``N/A``, ``NOT_SUPPORTED``, deprecated, absent) is ``None``;
the rules skip ``None`` instead of failing on it. Plain dataclasses, JSON round-trip via ``to_dict`` /
``from_dict`` so snapshots can be recorded, replayed and produced by the simulator.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, cast

# Probe status of a whole snapshot.
PROBE_OK = "ok"            # every GPU answered
PROBE_PARTIAL = "partial"  # some calls or GPUs failed (see GpuSnapshot.probe_errors)
PROBE_TIMEOUT = "timeout"  # the probe did not finish within its deadline
PROBE_FAILED = "failed"    # the probe could not start (NVML init failed, nvidia-smi error text)
PROBE_STATUSES = (PROBE_OK, PROBE_PARTIAL, PROBE_TIMEOUT, PROBE_FAILED)

# Clocks-event reason names (NVML nvmlClocksEventReason* bits; nvidia-smi element suffixes).
CLOCK_REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}


def ascii_re(pattern: str) -> re.Pattern[str]:
    """``re.compile(pattern)`` with ``\\d``, ``\\w``, ``\\s`` and ``\\b`` ASCII only. Every pattern that reads text from
    outside (kernel log, nvidia-smi output) is compiled so: Arabic-Indic and other Unicode digits are not digits
    there (``int()`` would read "\\u0667\\u0669" as 79, an Xid the catalog knows)."""
    return re.compile(pattern, re.ASCII)


_PCI_RE = ascii_re(
    r"(?:(?P<dom>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?")


def normalize_pci(value: Any) -> Optional[str]:
    """Return the PCI address as ``dddd:bb:dd`` (lower case, 4-digit domain, no function).

    Accepts NVML ``00000000:53:00.0``, kmsg ``0000:53:00``, old ``53:00.0`` and bytes. Kernel Xid lines
    print no function number, so the function is dropped to make both sides comparable.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    m = _PCI_RE.search(str(value).strip())
    if not m:
        return None
    dom = (m.group("dom") or "0000")[-4:]
    return f"{dom}:{m.group('bus')}:{m.group('dev')}".lower()


@dataclass
class NvLinkInfo:
    link: int
    active: Optional[bool] = None
    replay_errors: Optional[int] = None
    recovery_errors: Optional[int] = None
    crc_flit_errors: Optional[int] = None
    crc_data_errors: Optional[int] = None


@dataclass
class GpuSnapshot:
    index: int
    name: Optional[str] = None
    uuid: Optional[str] = None
    serial: Optional[str] = None
    pci_bus_id: Optional[str] = None
    vbios: Optional[str] = None
    architecture: Optional[str] = None
    # The GPU could not be reached at all (NVML GpuIsLost / nvidia-smi "GPU is lost" / Unknown Error on its handle).
    lost: bool = False
    probe_errors: Dict[str, str] = field(default_factory=dict)  # call/field -> error text (not NotSupported)
    # ECC
    ecc_enabled: Optional[bool] = None
    ecc_pending_enabled: Optional[bool] = None
    ecc_volatile_sbe: Optional[int] = None
    ecc_volatile_dbe: Optional[int] = None
    ecc_aggregate_sbe: Optional[int] = None
    ecc_aggregate_dbe: Optional[int] = None
    sram_threshold_exceeded: Optional[bool] = None
    # Page retirement (pre-Ampere) and row remapping (Ampere+)
    retired_pages_sbe: Optional[int] = None
    retired_pages_dbe: Optional[int] = None
    retired_pages_pending: Optional[bool] = None
    remapped_rows_correctable: Optional[int] = None
    remapped_rows_uncorrectable: Optional[int] = None
    remapped_rows_pending: Optional[bool] = None
    remapped_rows_failure: Optional[bool] = None
    # Temperatures (absolute degrees C; tlimit = degrees below the slowdown T.Limit on R535+/R580)
    temperature: Optional[float] = None
    temp_slowdown: Optional[float] = None
    temp_shutdown: Optional[float] = None
    temp_tlimit: Optional[float] = None
    temp_slowdown_tlimit: Optional[float] = None
    temp_shutdown_tlimit: Optional[float] = None
    memory_temperature: Optional[float] = None
    memory_temp_max: Optional[float] = None
    # Clocks-event reasons active now, and cumulative time in each (microseconds) where the source gives it
    clocks_event_reasons: Optional[List[str]] = None
    clocks_event_counters_us: Dict[str, int] = field(default_factory=dict)
    # Power (watts)
    power_draw: Optional[float] = None
    power_limit: Optional[float] = None
    power_default_limit: Optional[float] = None
    power_max_limit: Optional[float] = None
    utilization_gpu: Optional[float] = None
    performance_state: Optional[str] = None
    # PCIe
    pcie_gen_current: Optional[int] = None
    pcie_gen_max: Optional[int] = None
    pcie_width_current: Optional[int] = None
    pcie_width_max: Optional[int] = None
    pcie_replay_counter: Optional[int] = None
    # NVLink (None = no NVLink data in this source)
    nvlinks: Optional[List[NvLinkInfo]] = None
    # R565+: the GPU's own recovery request (NVML field 230 / Xid 154): 0 none .. 7 system reboot
    recovery_action: Optional[int] = None
    reset_required: Optional[bool] = None
    drain_and_reset_recommended: Optional[bool] = None
    persistence_mode: Optional[bool] = None
    fabric_state: Optional[str] = None
    fabric_status: Optional[str] = None
    fabric_health: Dict[str, str] = field(default_factory=dict)
    mig_enabled: Optional[bool] = None

    @property
    def pci(self) -> Optional[str]:
        return normalize_pci(self.pci_bus_id)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any], where: str = "gpu entry") -> GpuSnapshot:
        if isinstance(data, dict) and "index" not in data:
            raise ValueError(f"{where}: field 'index' is required (integer)")
        return _build(cls, data, where)


@dataclass
class IbPort:
    name: str                       # e.g. mlx5_0/1
    state: Optional[str] = None     # ACTIVE, DOWN, INIT ...
    phys_state: Optional[str] = None
    rate_gbps: Optional[float] = None
    link_layer: Optional[str] = None  # InfiniBand / Ethernet (RoCE)


@dataclass
class Mount:
    path: str
    present: bool = True
    fstype: Optional[str] = None
    read_only: Optional[bool] = None


@dataclass
class Disk:
    path: str
    total_bytes: Optional[int] = None
    free_bytes: Optional[int] = None


@dataclass
class Snapshot:
    """One probe of one node."""

    gpus: List[GpuSnapshot] = field(default_factory=list)
    hostname: Optional[str] = None
    source: Optional[str] = None            # nvml | nvidia-smi-xml | nvidia-smi-text | fake | sim
    timestamp: Optional[float] = None       # epoch seconds of the probe
    probe_status: str = PROBE_OK
    probe_error: Optional[str] = None       # text of the failure when probe_status is timeout/failed
    probe_error_code: Optional[int] = None  # NVML return code where known
    driver_version: Optional[str] = None
    cuda_version: Optional[str] = None
    attached_gpus: Optional[int] = None     # what the source claims is attached
    expected_gpus: Optional[int] = None
    boot_id: Optional[str] = None
    ib_ports: Optional[List[IbPort]] = None
    mounts: Optional[List[Mount]] = None
    disks: Optional[List[Disk]] = None
    memory_total_bytes: Optional[int] = None
    memory_available_bytes: Optional[int] = None
    probe_durations_ms: Dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Snapshot:
        """A snapshot from its to_dict() form (a recorded or hand-written file): every field's type is checked,
        so a bad file is a ValueError naming the field, never a crash in the rules."""
        if isinstance(data, dict) and data.get("probe_status", PROBE_OK) not in PROBE_STATUSES:
            raise ValueError(f"snapshot.probe_status: expected one of {', '.join(PROBE_STATUSES)}, "
                             f"got {data.get('probe_status')!r}")
        return _build(cls, data, "snapshot")


# ------------------------------------------------------------------ typed from_dict
_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def _scalar_ok(name: str, v: Any) -> bool:
    if name == "bool":
        return isinstance(v, bool)
    if name == "str":
        return isinstance(v, str)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if name == "int":
        return isinstance(v, int)
    return isinstance(v, int) or math.isfinite(v)  # float: finite


def _value(ann: str, v: Any, where: str) -> Any:
    """Check ``v`` against a field annotation (the few shapes these dataclasses use) and build nested records."""
    if ann.startswith("Optional["):
        if v is None:
            return None
        ann = ann[len("Optional["):-1]
    if ann in _SCALARS:
        if not _scalar_ok(ann, v):
            what = {"float": "a number", "int": "an integer", "str": "a string", "bool": "true or false"}[ann]
            raise ValueError(f"{where}: expected {what}, got {v!r:.80}")
        return v
    if ann.startswith("List["):
        if not isinstance(v, list):
            raise ValueError(f"{where}: expected a list, got {type(v).__name__}")
        return [_value(ann[len("List["):-1], x, f"{where}[{i}]") for i, x in enumerate(v)]
    if ann.startswith("Dict[str, "):
        inner = ann[len("Dict[str, "):-1]
        if not isinstance(v, dict) or not all(isinstance(k, str) and _scalar_ok(inner, x) for k, x in v.items()):
            raise ValueError(f"{where}: expected a mapping of names to {inner} values, got {v!r:.80}")
        return v
    cls = _RECORDS.get(ann)
    if cls is None:  # pragma: no cover - a new field type: add it above
        raise ValueError(f"{where}: cannot check type {ann}")
    if isinstance(v, cls):
        return v
    return cls.from_dict(v, where) if cls is GpuSnapshot else _build(cls, v, where)


def _build(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    kw = {}
    for name, value in data.items():
        # annotations are text here (from __future__ import annotations)
        kw[name] = _value(cast(str, fields[name].type), value, f"{where}.{name}")
    missing = [n for n, f in fields.items() if n not in kw and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}: field(s) {', '.join(missing)} required")
    return cls(**kw)


@dataclass
class KernelEvent:
    """One parsed kernel-log record that matters for GPU health."""

    kind: str                         # xid | sxid | fallen_off_bus | gpu_uuid | rate_limit
    raw: str
    xid: Optional[int] = None         # Xid or SXid code (fallen-off-bus is reported as 79)
    pci: Optional[str] = None         # normalized dddd:bb:dd
    pid: Optional[str] = None
    name: Optional[str] = None        # process name
    message: str = ""
    gpu_instance: Optional[int] = None
    compute_instance: Optional[int] = None
    switch: Optional[int] = None      # nvidia-nvswitchN
    severity: Optional[str] = None    # SXid / NVLink5: Fatal | Non-fatal | Nonfatal | ...
    monotonic: Optional[float] = None  # seconds since boot ([sec.usec] or /dev/kmsg usec)
    wallclock: Optional[float] = None  # epoch seconds when the prefix carries a date
    seq: Optional[int] = None          # /dev/kmsg sequence number
    boot_id: Optional[str] = None
    uuid: Optional[str] = None         # gpu_uuid records

    @property
    def ident(self) -> str:
        if self.seq is not None:
            return f"{self.boot_id or ''}:{self.seq}"
        return f"{self.monotonic or ''}|{self.wallclock or ''}|{self.raw}"

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


_RECORDS = {"GpuSnapshot": GpuSnapshot, "NvLinkInfo": NvLinkInfo, "IbPort": IbPort, "Mount": Mount, "Disk": Disk}
