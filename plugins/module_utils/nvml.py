# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVML adapter: live pynvml probe in a child process with a hard deadline.

``probe(nvml)`` reads one node through an object that looks like the ``pynvml`` module. In production that object
*is* ``pynvml`` (package ``nvidia-ml-py``); in tests and replays it is ``nvml_fake.FakeNvml``, configured from
JSON/YAML, which raises pynvml's real ``NVMLError_*`` classes (GPU lost, not supported, ...) and can hang on purpose.
The probe code path is the same for both. The fake lives in its own module, imported only when a fake is asked for
(``fake_nvml=...``, the agent's ``--fake-nvml``): nothing of it is loaded on a production probe.

``probe_with_deadline(...)`` runs ``probe`` in a forked child and waits at most ``deadline_s``. NVML hangs on wedged
GPUs (GSP timeouts, nvmlInit on some drivers, D-state): on timeout the child is SIGKILLed and, if it cannot die,
abandoned; the result is a snapshot with ``probe_status="timeout"`` (verdict unknown), never "healthy". A marker
file (optional) stops a second probe from starting while a stuck one is still alive.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import time
from typing import Any, Dict, List, Mapping, Optional, Union

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

#: A fake NVML config: the mapping, or the path of a JSON / YAML file (see nvml_fake).
FakeSpec = Union[str, "os.PathLike[str]", Mapping[str, Any]]

FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
_REASON_NAMES = (("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4),
                 ("hw_slowdown", 0x8), ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20),
                 ("hw_thermal_slowdown", 0x40), ("hw_power_brake_slowdown", 0x80), ("display_clocks_setting", 0x100))
_SKIP_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoData",
                "NVMLError_InvalidArgument", "NVMLError_Deprecated", "NVMLError_ArgumentVersionMismatch")
_FABRIC_STATES = {0: None, 1: "Not Started", 2: "In Progress", 3: "Completed"}


class _Lost(Exception):
    pass


def _errname(exc: BaseException) -> str:
    return type(exc).__name__


def _describe(exc: BaseException) -> str:
    return f"{_errname(exc)}({getattr(exc, 'value', '?')}): {exc}"


def _text(v: Any) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


class _Recorder:
    def __init__(self, nvml: Any, gpu: Optional[GpuSnapshot], timings: Dict[str, float]) -> None:
        self.nvml = nvml
        self.gpu = gpu
        self.timings = timings

    def __call__(self, fname: str, *args: Any, label: Optional[str] = None) -> Any:
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


def probe(nvml: Any = None, nvlink_max: int = 18) -> Snapshot:
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


def _probe_gpu(nvml: Any, g: GpuSnapshot, timings: Dict[str, float], nvlink_max: int) -> None:
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


def _probe_fabric(nvml: Any, g: GpuSnapshot, h: Any, call: _Recorder) -> None:
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


def _probe_nvlink(nvml: Any, g: GpuSnapshot, h: Any, call: _Recorder, nvlink_max: int) -> None:
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

def _child_run(fake_config: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    nvml: Any = None
    if fake_config is not None:
        # imported only when a fake is asked for: a production probe never loads it
        from .nvml_fake import FakeNvml  # pylint: disable=import-outside-toplevel
        nvml = FakeNvml(fake_config)
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


def probe_with_deadline(deadline_s: float = 20.0, fake_nvml: Optional[FakeSpec] = None,
                        marker_path: Optional[str] = None) -> Snapshot:
    """Probe in a forked child; give up after ``deadline_s`` seconds (timeout -> probe_status "timeout").

    fake_nvml: None (live pynvml), a path to a JSON/YAML fake config, or the config mapping.
    """
    fake_config = None
    if fake_nvml is not None:
        # imported only when a fake is asked for: a production probe never loads it
        from . import nvml_fake  # pylint: disable=import-outside-toplevel
        fake_config = nvml_fake.load_config(fake_nvml)
        nvml_fake.FakeNvml(fake_config)  # validate in the parent: a bad config is an error, not a probe failure
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
