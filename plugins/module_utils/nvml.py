# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVML adapter: live pynvml probe in a child process with a hard deadline, and a fake NVML for tests.

``probe(nvml)`` reads one node through an object that looks like the ``pynvml`` module. In production that object
*is* ``pynvml`` (package ``nvidia-ml-py``); in tests it is ``FakeNvml``, configured from JSON/YAML, which raises
pynvml's real ``NVMLError_*`` classes (GPU lost, not supported, ...) and can hang on purpose. The probe code path is
the same for both.

``probe_with_deadline(...)`` runs ``probe`` in a forked child and waits at most ``deadline_s``. NVML hangs on wedged
GPUs (GSP timeouts, nvmlInit on some drivers, D-state): on timeout the child is SIGKILLed and, if it cannot die,
abandoned; the result is a snapshot with ``probe_status="timeout"`` (verdict unknown), never "healthy". A marker
file (optional) stops a second probe from starting while a stuck one is still alive.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import select
import signal
import time
from typing import Any, Dict, List, Mapping, Optional

from . import safeyaml
from .health.model import (
    PROBE_FAILED,
    PROBE_PARTIAL,
    PROBE_TIMEOUT,
    GpuSnapshot,
    NvLinkInfo,
    Snapshot,
)

try:
    import pynvml
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError as _exc:  # pragma: no cover - depends on the node
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = str(_exc)

FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
_REASON_NAMES = (("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4),
                 ("hw_slowdown", 0x8), ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20),
                 ("hw_thermal_slowdown", 0x40), ("hw_power_brake_slowdown", 0x80), ("display_clocks_setting", 0x100))
_SKIP_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoData",
                "NVMLError_InvalidArgument", "NVMLError_Deprecated", "NVMLError_ArgumentVersionMismatch")
_FABRIC_STATES = {0: None, 1: "Not Started", 2: "In Progress", 3: "Completed"}


class _Lost(Exception):
    pass


def _errname(exc) -> str:
    return type(exc).__name__


def _describe(exc) -> str:
    return f"{_errname(exc)}({getattr(exc, 'value', '?')}): {exc}"


def _text(v) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


class _Recorder:
    def __init__(self, nvml, gpu: Optional[GpuSnapshot], timings: Dict[str, float]):
        self.nvml = nvml
        self.gpu = gpu
        self.timings = timings

    def __call__(self, fname: str, *args, label: Optional[str] = None):
        """Call nvml.<fname>(*args): None on NotSupported & co (skip), record other errors, _Lost on a lost GPU."""
        fn = getattr(self.nvml, fname, None)
        if fn is None:
            return None
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            name = _errname(exc)
            if name in _SKIP_ERRORS:
                return None
            if self.gpu is not None:
                self.gpu.probe_errors[label or fname] = _describe(exc)
            if name in ("NVMLError_GpuIsLost", "NVMLError_Unknown") and self.gpu is not None:
                self.gpu.lost = True
                raise _Lost()
            return None
        finally:
            key = label or fname
            self.timings[key] = self.timings.get(key, 0.0) + (time.perf_counter() - t0) * 1000.0


def probe(nvml=None, nvlink_max: int = 18) -> Snapshot:
    """Read every GPU through ``nvml`` (the pynvml module or a FakeNvml). In-process: wrap with a deadline."""
    if nvml is None:
        if not HAS_PYNVML:
            return Snapshot(source="nvml", probe_status=PROBE_FAILED, probe_error_code=12,
                            probe_error=f"pynvml (nvidia-ml-py) not importable: {PYNVML_IMPORT_ERROR}")
        nvml = pynvml
    timings: Dict[str, float] = {}
    snap = Snapshot(source=getattr(nvml, "SOURCE", "nvml"), timestamp=time.time(), probe_durations_ms=timings)
    t0 = time.perf_counter()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        snap.probe_status, snap.probe_error, snap.probe_error_code = PROBE_FAILED, _describe(exc), exc.value
        return snap
    finally:
        timings["nvmlInit"] = (time.perf_counter() - t0) * 1000.0
    try:
        call = _Recorder(nvml, None, timings)
        snap.driver_version = _text(call("nvmlSystemGetDriverVersion"))
        cuda = call("nvmlSystemGetCudaDriverVersion")
        if isinstance(cuda, int) and cuda > 0:
            snap.cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            snap.probe_status, snap.probe_error, snap.probe_error_code = PROBE_FAILED, _describe(exc), exc.value
            return snap
        snap.attached_gpus = count
        for i in range(count):
            g = GpuSnapshot(index=i)
            snap.gpus.append(g)
            try:
                _probe_gpu(nvml, g, timings, nvlink_max)
            except _Lost:
                pass
        if any(g.lost for g in snap.gpus):
            snap.probe_status = PROBE_PARTIAL
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutdown errors never change the result
            pass
    return snap


def _probe_gpu(nvml, g: GpuSnapshot, timings, nvlink_max: int) -> None:
    call = _Recorder(nvml, g, timings)
    h = call("nvmlDeviceGetHandleByIndex", g.index, label="handle")
    if h is None:
        if g.probe_errors:
            g.lost = True
        return
    g.name = _text(call("nvmlDeviceGetName", h))
    g.uuid = _text(call("nvmlDeviceGetUUID", h))
    g.serial = _text(call("nvmlDeviceGetSerial", h))
    pci = call("nvmlDeviceGetPciInfo_v3", h)
    if pci is not None:
        g.pci_bus_id = _text(getattr(pci, "busId", None))
    g.vbios = _text(call("nvmlDeviceGetVbiosVersion", h))
    ecc = call("nvmlDeviceGetEccMode", h)
    if ecc:
        g.ecc_enabled, g.ecc_pending_enabled = bool(ecc[0]), bool(ecc[1])
    if g.ecc_enabled:
        U, C = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        V, A = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
        g.ecc_volatile_sbe = call("nvmlDeviceGetTotalEccErrors", h, C, V, label="ecc_volatile_sbe")
        g.ecc_volatile_dbe = call("nvmlDeviceGetTotalEccErrors", h, U, V, label="ecc_volatile_dbe")
        g.ecc_aggregate_sbe = call("nvmlDeviceGetTotalEccErrors", h, C, A, label="ecc_aggregate_sbe")
        g.ecc_aggregate_dbe = call("nvmlDeviceGetTotalEccErrors", h, U, A, label="ecc_aggregate_dbe")
    rr = call("nvmlDeviceGetRemappedRows", h)
    if rr:
        g.remapped_rows_correctable, g.remapped_rows_uncorrectable = int(rr[0]), int(rr[1])
        g.remapped_rows_pending, g.remapped_rows_failure = bool(rr[2]), bool(rr[3])
    else:  # pre-Ampere: page retirement
        sbe = call("nvmlDeviceGetRetiredPages", h, 0, label="retired_pages_sbe")
        dbe = call("nvmlDeviceGetRetiredPages", h, 1, label="retired_pages_dbe")
        g.retired_pages_sbe = len(sbe) if sbe is not None else None
        g.retired_pages_dbe = len(dbe) if dbe is not None else None
        pend = call("nvmlDeviceGetRetiredPagesPendingStatus", h)
        g.retired_pages_pending = bool(pend) if pend is not None else None
    g.temperature = call("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
    g.temp_slowdown = call("nvmlDeviceGetTemperatureThreshold", h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                           label="temp_slowdown")
    g.temp_shutdown = call("nvmlDeviceGetTemperatureThreshold", h, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
                           label="temp_shutdown")
    g.temp_tlimit = call("nvmlDeviceGetMarginTemperature", h)
    mask = call("nvmlDeviceGetCurrentClocksEventReasons", h)
    if isinstance(mask, int):
        g.clocks_event_reasons = [n for n, bit in _REASON_NAMES if mask & bit]
    p = call("nvmlDeviceGetPowerUsage", h)
    g.power_draw = p / 1000.0 if p is not None else None
    p = call("nvmlDeviceGetEnforcedPowerLimit", h)
    g.power_limit = p / 1000.0 if p is not None else None
    p = call("nvmlDeviceGetPowerManagementDefaultLimit", h)
    g.power_default_limit = p / 1000.0 if p is not None else None
    util = call("nvmlDeviceGetUtilizationRates", h)
    if util is not None:
        g.utilization_gpu = getattr(util, "gpu", None)
    g.pcie_gen_current = call("nvmlDeviceGetCurrPcieLinkGeneration", h)
    g.pcie_gen_max = call("nvmlDeviceGetMaxPcieLinkGeneration", h)
    g.pcie_width_current = call("nvmlDeviceGetCurrPcieLinkWidth", h)
    g.pcie_width_max = call("nvmlDeviceGetMaxPcieLinkWidth", h)
    g.pcie_replay_counter = call("nvmlDeviceGetPcieReplayCounter", h)
    pm = call("nvmlDeviceGetPersistenceMode", h)
    g.persistence_mode = bool(pm) if pm is not None else None
    mig = call("nvmlDeviceGetMigMode", h)
    if mig:
        g.mig_enabled = bool(mig[0])
    vals = call("nvmlDeviceGetFieldValues", h, [FIELD_RECOVERY_ACTION], label="field_values")
    if vals is not None and len(vals) and getattr(vals[0], "nvmlReturn", 1) == 0:
        g.recovery_action = int(vals[0].value.uiVal)
    _probe_fabric(nvml, g, h, call)
    _probe_nvlink(nvml, g, h, call, nvlink_max)


def _probe_fabric(nvml, g, h, call) -> None:
    cls = getattr(nvml, "c_nvmlGpuFabricInfo_v3_t", None)
    if cls is None:
        return
    info = cls()
    if call("nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(info), label="fabric") is None:
        return
    state = _FABRIC_STATES.get(int(info.state) & 0xFF)
    if state is None:
        return
    g.fabric_state = state
    g.fabric_status = "Success" if int(info.status) == 0 else f"Error {int(info.status)}"


def _probe_nvlink(nvml, g, h, call, nvlink_max) -> None:
    links: List[NvLinkInfo] = []
    for link in range(nvlink_max):
        st = call("nvmlDeviceGetNvLinkState", h, link, label="nvlink_state")
        if st is None:
            break  # NotSupported / InvalidArgument: no (more) links
        n = NvLinkInfo(link=link, active=bool(st))
        for attr, counter in (("replay_errors", 0), ("recovery_errors", 1), ("crc_flit_errors", 2),
                              ("crc_data_errors", 3)):
            setattr(n, attr, call("nvmlDeviceGetNvLinkErrorCounter", h, link, counter, label="nvlink_errors"))
        links.append(n)
    g.nvlinks = links or None


# ------------------------------------------------------------------ child process with a deadline
def _load_config(spec) -> Dict[str, Any]:
    if isinstance(spec, Mapping):
        return dict(spec)
    path = os.fspath(spec)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if path.endswith((".yml", ".yaml")):
        data = safeyaml.load(text, f"fake_nvml {path}")
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"fake_nvml {path}: not valid JSON: {exc}")
        except RecursionError:
            raise ValueError(f"fake_nvml {path}: nested too deeply")
    if not isinstance(data, dict):
        raise ValueError(f"fake_nvml {path}: expected a mapping at the top level")
    return data


def _child_run(fake_config) -> Dict[str, Any]:
    nvml = FakeNvml(fake_config) if fake_config is not None else None
    return probe(nvml).to_dict()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def probe_with_deadline(deadline_s: float = 20.0, fake_nvml=None, marker_path: Optional[str] = None) -> Snapshot:
    """Probe in a forked child; give up after ``deadline_s`` seconds (timeout -> probe_status "timeout").

    fake_nvml: None (live pynvml), a path to a JSON/YAML fake config, or the config mapping.
    """
    fake_config = _load_config(fake_nvml) if fake_nvml is not None else None
    if fake_config is not None:
        FakeNvml(fake_config)  # validate in the parent: a bad config is an error, not a probe failure
    if fake_config is None and not HAS_PYNVML:
        return probe(None)
    if marker_path:
        try:
            with open(marker_path, encoding="ascii") as fh:
                old = int(fh.read().strip() or 0)
            if old and _alive(old):
                return Snapshot(source="nvml", timestamp=time.time(), probe_status=PROBE_TIMEOUT,
                                probe_error=f"previous NVML probe (pid {old}) is still stuck; not starting another")
        except (OSError, ValueError):
            pass
    if not hasattr(os, "fork"):  # pragma: no cover - non-POSIX
        return Snapshot.from_dict(_child_run(fake_config))
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(rfd)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                result = _child_run(fake_config)
            except Exception as exc:  # noqa: BLE001 - report, never hang the parent
                result = Snapshot(source="nvml", timestamp=time.time(), probe_status=PROBE_FAILED,
                                  probe_error=f"probe crashed: {type(exc).__name__}: {exc}").to_dict()
            data = json.dumps(result).encode()
            view = memoryview(data)
            while view:
                n = os.write(wfd, view)
                view = view[n:]
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    if marker_path:
        _write_marker(marker_path, pid)
    start = time.monotonic()
    chunks: List[bytes] = []
    timed_out = False
    try:
        while True:
            left = deadline_s - (time.monotonic() - start)
            if left <= 0:
                timed_out = True
                break
            ready, _wready, _xready = select.select([rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
    elapsed = time.monotonic() - start
    if timed_out:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reaped = _reap(pid, 0.5)
        if reaped and marker_path:
            _clear_marker(marker_path)
        return Snapshot(source="nvml", timestamp=time.time(), probe_status=PROBE_TIMEOUT,
                        probe_error=f"NVML probe did not finish within {deadline_s:g} s"
                                    + ("" if reaped else f" (child {pid} is stuck and was abandoned)"),
                        probe_durations_ms={"total": elapsed * 1000.0})
    _reap(pid, 2.0)
    if marker_path:
        _clear_marker(marker_path)
    try:
        snap = Snapshot.from_dict(json.loads(b"".join(chunks).decode()))
    except (ValueError, TypeError):
        return Snapshot(source="nvml", timestamp=time.time(), probe_status=PROBE_FAILED,
                        probe_error="NVML probe child died without a result")
    snap.probe_durations_ms["total"] = elapsed * 1000.0
    return snap


def _reap(pid: int, wait_s: float) -> bool:
    end = time.monotonic() + wait_s
    while True:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def _write_marker(path: str, pid: int) -> None:
    try:
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(str(pid))
        os.replace(tmp, path)
    except OSError:
        pass


def _clear_marker(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# ------------------------------------------------------------------ fake NVML
_DEVICE_DEFAULTS: Dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3", "serial": "1650000000000", "vbios": "96.00.99.00.01",
    "ecc_mode": [1, 1], "ecc_volatile_sbe": 0, "ecc_volatile_dbe": 0, "ecc_aggregate_sbe": 0,
    "ecc_aggregate_dbe": 0, "remapped_rows": [0, 0, 0, 0], "temperature": 35, "temp_slowdown": None,
    "temp_shutdown": None, "temp_margin": 50, "clocks_event_reasons": ["gpu_idle"], "power_usage_mw": 70000,
    "power_limit_mw": 700000, "power_default_mw": 700000, "utilization": 0, "pcie_gen": 5, "pcie_gen_max": 5,
    "pcie_width": 16, "pcie_width_max": 16, "pcie_replay": 100, "persistence": 1, "mig": [0, 0],
    "recovery_action": 0, "fabric": {"state": 3, "status": 0}, "nvlinks": 18, "nvlink_down": [],
    "nvlink_errors": {},
}
_DEVICE_KEYS = set(_DEVICE_DEFAULTS) | {"uuid", "pci_bus_id", "fail", "not_supported", "hang", "index",
                                        "retired_pages"}
_TOP_KEYS = {"driver_version", "cuda_version", "count", "devices", "device_defaults", "init_error", "hang",
             "_comment", "_source"}


# A replayed config is a file from outside (a capture, a bug report): every value is checked here, so a bad one
# is a ValueError naming the field instead of a TypeError (or a 2**31-GPU allocation) in the middle of a probe.
MAX_FAKE_GPUS = 256
MAX_FAKE_RETIRED_PAGES = 4096
_NUM_KEYS = {"ecc_volatile_sbe", "ecc_volatile_dbe", "ecc_aggregate_sbe", "ecc_aggregate_dbe", "temperature",
             "power_usage_mw", "power_limit_mw", "power_default_mw", "utilization", "pcie_gen", "pcie_gen_max",
             "pcie_width", "pcie_width_max", "pcie_replay", "persistence"}
_OPT_NUM_KEYS = {"temp_slowdown", "temp_shutdown", "temp_margin", "recovery_action"}
_STR_KEYS = {"name", "serial", "vbios", "uuid", "pci_bus_id"}
_INT_LISTS = {"ecc_mode": 2, "mig": 2, "remapped_rows": 4}


def _is_num(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return abs(v) < 2 ** 63 if isinstance(v, int) else math.isfinite(v)


def _is_int(v: Any, lo: int = 0, hi: int = 2 ** 63) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _check_counts(v: Any, where: str, keys) -> None:
    if v is None:
        return
    if not isinstance(v, Mapping):
        raise ValueError(f"{where}: expected a mapping of {', '.join(keys)} to numbers")
    for k in keys:
        if k in v and not _is_int(v[k], 0, MAX_FAKE_RETIRED_PAGES):
            raise ValueError(f"{where}.{k}: expected an integer 0..{MAX_FAKE_RETIRED_PAGES}, got {v[k]!r}")


def _check_device(d: Mapping[str, Any], where: str) -> None:
    """Type and range of every device value a probe reads (ValueError naming the field)."""
    for key, value in d.items():
        w = f"{where}.{key}"
        if key in _NUM_KEYS or (key in _OPT_NUM_KEYS and value is not None):
            if not _is_num(value):
                raise ValueError(f"{w}: expected a number, got {value!r}")
        elif key in _STR_KEYS:
            if not isinstance(value, str):
                raise ValueError(f"{w}: expected a string, got {value!r}")
        elif key in _INT_LISTS and not (key == "remapped_rows" and value is None):
            if (not isinstance(value, list) or len(value) != _INT_LISTS[key]
                    or not all(_is_int(x, -(2 ** 63)) for x in value)):
                raise ValueError(f"{w}: expected a list of {_INT_LISTS[key]} integers, got {value!r}")
        elif key == "clocks_event_reasons":
            names = dict(_REASON_NAMES)
            is_list = isinstance(value, list) and all(isinstance(n, str) and n in names for n in value)
            if not _is_int(value) and not is_list:
                raise ValueError(f"{w}: expected a bit mask or a list of {', '.join(names)}, got {value!r}")
        elif key == "fabric":
            _check_counts(value, w, ("state", "status"))
        elif key == "retired_pages":
            _check_counts(value, w, ("sbe", "dbe", "pending"))
        elif key == "nvlinks":
            if not _is_int(value, 0, 64):
                raise ValueError(f"{w}: expected an integer 0..64, got {value!r}")
        elif key in ("nvlink_down", "not_supported"):
            kind = int if key == "nvlink_down" else str
            if not isinstance(value, list) or not all(isinstance(x, kind) and not isinstance(x, bool) for x in value):
                raise ValueError(f"{w}: expected a list of {'link numbers' if kind is int else 'NVML call names'}")
        elif key == "nvlink_errors":
            if not isinstance(value, Mapping):
                raise ValueError(f"{w}: expected a mapping of link number to counters")
            for link, counters in value.items():
                if not isinstance(counters, Mapping) or not all(_is_int(c) for c in counters.values()):
                    raise ValueError(f"{w}.{link}: expected a mapping of counter name to integer >= 0")
        elif key in ("fail", "hang") and value is not None:
            if not isinstance(value, Mapping):
                raise ValueError(f"{w}: expected a mapping")
            if key == "fail" and not isinstance(value.get("mode", "lost"), str):
                raise ValueError(f"{w}.mode: expected lost, unknown, reset_required or an NVMLError_* name")
            if key == "fail" and not _is_int(value.get("after_calls", 0)):
                raise ValueError(f"{w}.after_calls: expected an integer >= 0, got {value.get('after_calls')!r}")
            if key == "hang" and not _is_num(value.get("seconds", 0)):
                raise ValueError(f"{w}.seconds: expected a number, got {value.get('seconds')!r}")


class _Handle:
    def __init__(self, index: int):
        self.index = index


class _Util:
    def __init__(self, gpu: int):
        self.gpu = gpu
        self.memory = 0


class _Pci:
    def __init__(self, bus_id: str):
        self.busId = bus_id.encode()
        self.busIdLegacy = bus_id.encode()


class FakeNvml:
    """Stands in for the ``pynvml`` module. Constants, struct classes and error classes are pynvml's own.

    Config (JSON or YAML), modelled on NVIDIA mocknvml's schema::

        driver_version: "580.105.08"      cuda_version: 13000        count: 8 (default 8)
        init_error: LibRmVersionMismatch  # any NVMLError_* suffix: nvmlInit raises it
        hang: {call: nvmlInit, seconds: 60}
        device_defaults: {name: ..., temperature: 35, ...}   # keys of _DEVICE_DEFAULTS
        devices:
          - index: 2
            remapped_rows: [0, 4, 1, 0]          # corr, unc, pending, failure
            fail: {mode: lost, after_calls: 5}   # lost | unknown | reset_required: raise on every call after N
            not_supported: [nvmlDeviceGetRemappedRows]
            hang: {call: nvmlDeviceGetTemperature, seconds: 60}
    """

    SOURCE = "fake-nvml"

    def __init__(self, config: Optional[Mapping[str, Any]] = None):
        if not HAS_PYNVML:
            raise ValueError(f"the fake NVML raises pynvml's real error classes: install nvidia-ml-py "
                             f"({PYNVML_IMPORT_ERROR})")
        cfg = dict(config or {})
        bad = sorted(str(k) for k in set(cfg) - _TOP_KEYS)
        if bad:
            raise ValueError(f"fake_nvml: unknown key(s) {', '.join(bad)} (expected {', '.join(sorted(_TOP_KEYS))})")
        self.cfg = cfg
        defaults = dict(_DEVICE_DEFAULTS)
        dd = cfg.get("device_defaults") or {}
        if not isinstance(dd, Mapping):
            raise ValueError("fake_nvml.device_defaults: expected a mapping")
        bad = sorted(str(k) for k in set(dd) - _DEVICE_KEYS)
        if bad:
            raise ValueError(f"fake_nvml.device_defaults: unknown key(s) {', '.join(bad)}")
        defaults.update(dd)
        devices = cfg.get("devices") or []
        if not isinstance(devices, list):
            raise ValueError("fake_nvml.devices: expected a list of device mappings")
        count = cfg.get("count", 8)
        if not _is_int(count, 0, MAX_FAKE_GPUS):
            raise ValueError(f"fake_nvml.count: expected an integer 0..{MAX_FAKE_GPUS}, got {count!r}")
        if not _is_int(cfg.get("cuda_version", 0)):
            raise ValueError(f"fake_nvml.cuda_version: expected an integer such as 13000, got {cfg['cuda_version']!r}")
        for key in ("driver_version", "init_error"):
            if cfg.get(key) is not None and not isinstance(cfg[key], str):
                raise ValueError(f"fake_nvml.{key}: expected a string, got {cfg[key]!r}")
        _check_device(defaults, "fake_nvml.device_defaults")
        self.devices: List[Dict[str, Any]] = []
        for i in range(count):
            d = dict(defaults)
            d["uuid"] = f"GPU-fa4e0000-0000-0000-0000-{i:012d}"
            d["pci_bus_id"] = f"00000000:{0x18 + 0x10 * i:02X}:00.0"
            self.devices.append(d)
        for n, dev in enumerate(devices):
            if not isinstance(dev, Mapping):
                raise ValueError(f"fake_nvml.devices[{n}]: expected a mapping")
            bad = sorted(str(k) for k in set(dev) - _DEVICE_KEYS)
            if bad:
                raise ValueError(f"fake_nvml.devices[{n}]: unknown key(s) {', '.join(bad)}")
            idx = dev.get("index", n)
            if not isinstance(idx, int) or not 0 <= idx < count:
                raise ValueError(f"fake_nvml.devices[{n}].index: expected 0..{count - 1}, got {idx!r}")
            _check_device({k: v for k, v in dev.items() if k != "index"}, f"fake_nvml.devices[{n}]")
            self.devices[idx].update({k: v for k, v in dev.items() if k != "index"})
        self.calls = [0] * count
        self.initialized = False

    # constants, structs and NVMLError classes come from the real module
    def __getattr__(self, name):
        if name.startswith("nvml"):
            def missing(*_a, **_k):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return missing
        return getattr(pynvml, name)

    @staticmethod
    def _error(name: str):
        cls = getattr(pynvml, name if name.startswith("NVMLError_") else "NVMLError_" + name, None)
        if cls is None or not isinstance(cls, type) or not issubclass(cls, pynvml.NVMLError):
            raise ValueError(f"fake_nvml: unknown NVML error {name!r} (expected a pynvml NVMLError_* name)")
        return cls()

    def _hang(self, spec, call: str) -> None:
        if isinstance(spec, Mapping) and spec.get("call", call) == call:
            time.sleep(float(spec.get("seconds", 3600)))

    def _dev(self, handle, call: str) -> Dict[str, Any]:
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        d = self.devices[handle.index]
        self._hang(d.get("hang"), call)
        if call in (d.get("not_supported") or ()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        fail = d.get("fail")
        self.calls[handle.index] += 1
        if isinstance(fail, Mapping) and self.calls[handle.index] > int(fail.get("after_calls", 0)):
            mode = fail.get("mode", "lost")
            name = {"lost": "GpuIsLost", "fallen_off_bus": "GpuIsLost", "unknown": "Unknown",
                    "reset_required": "ResetRequired"}.get(mode, mode)
            raise self._error(name)
        return d

    # -- system
    def nvmlInit(self):
        self._hang(self.cfg.get("hang"), "nvmlInit")
        if self.cfg.get("init_error"):
            raise self._error(str(self.cfg["init_error"]))
        self.initialized = True

    def nvmlShutdown(self):
        self.initialized = False

    def nvmlSystemGetDriverVersion(self):
        return self.cfg.get("driver_version", "580.105.08")

    def nvmlSystemGetCudaDriverVersion(self):
        return int(self.cfg.get("cuda_version", 13000))

    def nvmlDeviceGetCount(self):
        self._hang(self.cfg.get("hang"), "nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        h = _Handle(index)
        self._dev(h, "nvmlDeviceGetHandleByIndex")
        return h

    # -- identity
    def nvmlDeviceGetName(self, h):
        return self._dev(h, "nvmlDeviceGetName")["name"]

    def nvmlDeviceGetUUID(self, h):
        return self._dev(h, "nvmlDeviceGetUUID")["uuid"]

    def nvmlDeviceGetSerial(self, h):
        return self._dev(h, "nvmlDeviceGetSerial")["serial"]

    def nvmlDeviceGetPciInfo_v3(self, h):
        return _Pci(self._dev(h, "nvmlDeviceGetPciInfo_v3")["pci_bus_id"])

    def nvmlDeviceGetVbiosVersion(self, h):
        return self._dev(h, "nvmlDeviceGetVbiosVersion")["vbios"]

    # -- memory errors
    def nvmlDeviceGetEccMode(self, h):
        return list(self._dev(h, "nvmlDeviceGetEccMode")["ecc_mode"])

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        d = self._dev(h, "nvmlDeviceGetTotalEccErrors")
        scope = "volatile" if counter_type == pynvml.NVML_VOLATILE_ECC else "aggregate"
        kind = "dbe" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "sbe"
        return int(d[f"ecc_{scope}_{kind}"])

    def nvmlDeviceGetRemappedRows(self, h):
        d = self._dev(h, "nvmlDeviceGetRemappedRows")
        if d.get("remapped_rows") is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return tuple(int(x) for x in d["remapped_rows"])

    def nvmlDeviceGetRetiredPages(self, h, cause):
        d = self._dev(h, "nvmlDeviceGetRetiredPages")
        rp = d.get("retired_pages")
        if rp is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(range(int(rp.get("dbe" if cause else "sbe", 0))))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        rp = self._dev(h, "nvmlDeviceGetRetiredPagesPendingStatus").get("retired_pages")
        if rp is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(bool(rp.get("pending", 0)))

    # -- thermal, clocks, power
    def nvmlDeviceGetTemperature(self, h, sensor):
        return int(self._dev(h, "nvmlDeviceGetTemperature")["temperature"])

    def nvmlDeviceGetTemperatureThreshold(self, h, which):
        d = self._dev(h, "nvmlDeviceGetTemperatureThreshold")
        v = d["temp_slowdown"] if which == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else d["temp_shutdown"]
        if v is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(v)

    def nvmlDeviceGetMarginTemperature(self, h):
        v = self._dev(h, "nvmlDeviceGetMarginTemperature")["temp_margin"]
        if v is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(v)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        r = self._dev(h, "nvmlDeviceGetCurrentClocksEventReasons")["clocks_event_reasons"]
        if isinstance(r, int):
            return r
        bits = dict(_REASON_NAMES)
        mask = 0
        for name in r:
            if name not in bits:
                raise ValueError(f"fake_nvml: unknown clocks event reason {name!r} (expected {', '.join(bits)})")
            mask |= bits[name]
        return mask

    def nvmlDeviceGetPowerUsage(self, h):
        return int(self._dev(h, "nvmlDeviceGetPowerUsage")["power_usage_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return int(self._dev(h, "nvmlDeviceGetEnforcedPowerLimit")["power_limit_mw"])

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return int(self._dev(h, "nvmlDeviceGetPowerManagementDefaultLimit")["power_default_mw"])

    def nvmlDeviceGetUtilizationRates(self, h):
        return _Util(int(self._dev(h, "nvmlDeviceGetUtilizationRates")["utilization"]))

    # -- PCIe
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return int(self._dev(h, "nvmlDeviceGetCurrPcieLinkGeneration")["pcie_gen"])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return int(self._dev(h, "nvmlDeviceGetMaxPcieLinkGeneration")["pcie_gen_max"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return int(self._dev(h, "nvmlDeviceGetCurrPcieLinkWidth")["pcie_width"])

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return int(self._dev(h, "nvmlDeviceGetMaxPcieLinkWidth")["pcie_width_max"])

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return int(self._dev(h, "nvmlDeviceGetPcieReplayCounter")["pcie_replay"])

    # -- modes, recovery action, fabric
    def nvmlDeviceGetPersistenceMode(self, h):
        return int(self._dev(h, "nvmlDeviceGetPersistenceMode")["persistence"])

    def nvmlDeviceGetMigMode(self, h):
        return list(self._dev(h, "nvmlDeviceGetMigMode")["mig"])

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        d = self._dev(h, "nvmlDeviceGetFieldValues")
        arr = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            arr[i].fieldId = fid
            if fid == FIELD_RECOVERY_ACTION and d.get("recovery_action") is not None:
                arr[i].nvmlReturn = pynvml.NVML_SUCCESS
                arr[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                arr[i].value.uiVal = int(d["recovery_action"])
            else:
                arr[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return arr

    def nvmlDeviceGetGpuFabricInfoV(self, h, info_ref):
        d = self._dev(h, "nvmlDeviceGetGpuFabricInfoV")
        fab = d.get("fabric")
        if not fab:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = getattr(info_ref, "_obj", info_ref)
        info.state = int(fab.get("state", 3))
        info.status = int(fab.get("status", 0))
        return pynvml.NVML_SUCCESS

    # -- NVLink
    def nvmlDeviceGetNvLinkState(self, h, link):
        d = self._dev(h, "nvmlDeviceGetNvLinkState")
        if not d.get("nvlinks"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= int(d["nvlinks"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in (d.get("nvlink_down") or ()) else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        d = self._dev(h, "nvmlDeviceGetNvLinkErrorCounter")
        errs = (d.get("nvlink_errors") or {}).get(str(link)) or {}
        key = ("replay", "recovery", "crc_flit", "crc_data")[counter] if counter < 4 else "ecc"
        return int(errs.get(key, 0))


def fake_config_from_snapshot(snap: Snapshot) -> Dict[str, Any]:
    """A FakeNvml config that replays ``snap`` (what ``--record`` writes), so a live incident becomes a fixture."""
    devices = []
    for g in snap.gpus:
        d: Dict[str, Any] = {"index": g.index}
        if g.lost:
            d["fail"] = {"mode": "lost", "after_calls": 5}  # identity answered, then lost (as the capture shows)
        for key, value in (("name", g.name), ("uuid", g.uuid), ("serial", g.serial), ("pci_bus_id", g.pci_bus_id),
                           ("vbios", g.vbios), ("temperature", g.temperature), ("temp_slowdown", g.temp_slowdown),
                           ("temp_shutdown", g.temp_shutdown), ("temp_margin", g.temp_tlimit),
                           ("clocks_event_reasons", g.clocks_event_reasons), ("utilization", g.utilization_gpu),
                           ("pcie_gen", g.pcie_gen_current), ("pcie_gen_max", g.pcie_gen_max),
                           ("pcie_width", g.pcie_width_current), ("pcie_width_max", g.pcie_width_max),
                           ("pcie_replay", g.pcie_replay_counter), ("recovery_action", g.recovery_action),
                           ("ecc_volatile_sbe", g.ecc_volatile_sbe), ("ecc_volatile_dbe", g.ecc_volatile_dbe),
                           ("ecc_aggregate_sbe", g.ecc_aggregate_sbe), ("ecc_aggregate_dbe", g.ecc_aggregate_dbe)):
            if value is not None:
                d[key] = value
        if g.ecc_enabled is not None:
            d["ecc_mode"] = [int(g.ecc_enabled), int(bool(g.ecc_pending_enabled))]
        if g.remapped_rows_pending is not None:
            d["remapped_rows"] = [g.remapped_rows_correctable or 0, g.remapped_rows_uncorrectable or 0,
                                  int(g.remapped_rows_pending), int(bool(g.remapped_rows_failure))]
        for key, value, scale in (("power_usage_mw", g.power_draw, 1000), ("power_limit_mw", g.power_limit, 1000),
                                  ("power_default_mw", g.power_default_limit, 1000)):
            if value is not None:
                d[key] = int(round(value * scale))
        if g.persistence_mode is not None:
            d["persistence"] = int(g.persistence_mode)
        if g.fabric_state is not None:
            inv = {v: k for k, v in _FABRIC_STATES.items() if v}
            d["fabric"] = {"state": inv.get(g.fabric_state, 3), "status": 0 if g.fabric_status == "Success" else 1}
        else:
            d["fabric"] = None
        if g.nvlinks is not None:
            d["nvlinks"] = len(g.nvlinks)
            d["nvlink_down"] = [n.link for n in g.nvlinks if n.active is False]
        else:
            d["nvlinks"] = 0
        for key in ("temp_slowdown", "temp_shutdown", "temp_margin"):
            d.setdefault(key, None)
        devices.append(d)
    return {"_source": f"recorded from {snap.source} on {snap.hostname or 'unknown host'} at {snap.timestamp}",
            "driver_version": snap.driver_version or "unknown",
            "cuda_version": _cuda_int(snap.cuda_version), "count": len(snap.gpus), "devices": devices}


def _cuda_int(v: Optional[str]) -> int:
    try:
        major, minor = (v or "0.0").split(".")[:2]
        return int(major) * 1000 + int(minor) * 10
    except ValueError:
        return 0
