# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fake NVML for tests and replays: stands in for the ``pynvml`` module, raising pynvml's real ``NVMLError_*``.

Not part of a production probe: ``nvml.probe_with_deadline`` imports this module only when a fake is asked for (the
agent's ``--fake-nvml``, the gpu_health module's ``fake_nvml``). A config is a file from outside (a capture, a bug
report): every value is checked, so a bad one is a ValueError naming the field, never a crash mid-probe.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple

from . import safeyaml
from .health.model import Snapshot
from .nvml import _FABRIC_STATES, _REASON_NAMES, FIELD_RECOVERY_ACTION, HAS_PYNVML, PYNVML_IMPORT_ERROR, FakeSpec

try:  # the real module: its constants, structs and NVMLError_* classes (HAS_PYNVML says whether it imported)
    import pynvml
except ImportError:  # pragma: no cover - depends on the machine
    pynvml = None


def load_config(spec: FakeSpec) -> Dict[str, Any]:
    """A fake config: the mapping itself, or a JSON file or a YAML one (``.yml``, ``.yaml``, read through safeyaml)."""
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


def _check_counts(v: Any, where: str, keys: Sequence[str]) -> None:
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
    def __init__(self, index: int) -> None:
        self.index = index


class _Util:
    def __init__(self, gpu: int) -> None:
        self.gpu = gpu
        self.memory = 0


class _Pci:
    def __init__(self, bus_id: str) -> None:
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
    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            def missing(*_a: Any, **_k: Any) -> NoReturn:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return missing
        return getattr(pynvml, name)

    @staticmethod
    def _error(name: str) -> Exception:
        cls = getattr(pynvml, name if name.startswith("NVMLError_") else "NVMLError_" + name, None)
        if cls is None or not isinstance(cls, type) or not issubclass(cls, pynvml.NVMLError):
            raise ValueError(f"fake_nvml: unknown NVML error {name!r} (expected a pynvml NVMLError_* name)")
        exc: Exception = cls()
        return exc

    def _hang(self, spec: Any, call: str) -> None:
        if isinstance(spec, Mapping) and spec.get("call", call) == call:
            time.sleep(float(spec.get("seconds", 3600)))

    def _dev(self, handle: _Handle, call: str) -> Dict[str, Any]:
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        d: Dict[str, Any] = self.devices[handle.index]
        self._hang(d.get("hang"), call)
        if call in (d.get("not_supported") or ()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        fail = d.get("fail")
        self.calls[handle.index] += 1
        if isinstance(fail, Mapping) and self.calls[handle.index] > int(fail.get("after_calls", 0)):
            mode = str(fail.get("mode", "lost"))
            name = {"lost": "GpuIsLost", "fallen_off_bus": "GpuIsLost", "unknown": "Unknown",
                    "reset_required": "ResetRequired"}.get(mode, mode)
            raise self._error(name)
        return d

    # -- system
    def nvmlInit(self) -> None:
        self._hang(self.cfg.get("hang"), "nvmlInit")
        if self.cfg.get("init_error"):
            raise self._error(str(self.cfg["init_error"]))
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> Optional[str]:
        version: Optional[str] = self.cfg.get("driver_version", "580.105.08")
        return version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self.cfg.get("cuda_version", 13000))

    def nvmlDeviceGetCount(self) -> int:
        self._hang(self.cfg.get("hang"), "nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        h = _Handle(index)
        self._dev(h, "nvmlDeviceGetHandleByIndex")
        return h

    # -- identity
    def nvmlDeviceGetName(self, h: _Handle) -> str:
        value: str = self._dev(h, "nvmlDeviceGetName")["name"]
        return value

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        value: str = self._dev(h, "nvmlDeviceGetUUID")["uuid"]
        return value

    def nvmlDeviceGetSerial(self, h: _Handle) -> str:
        value: str = self._dev(h, "nvmlDeviceGetSerial")["serial"]
        return value

    def nvmlDeviceGetPciInfo_v3(self, h: _Handle) -> _Pci:
        return _Pci(self._dev(h, "nvmlDeviceGetPciInfo_v3")["pci_bus_id"])

    def nvmlDeviceGetVbiosVersion(self, h: _Handle) -> str:
        value: str = self._dev(h, "nvmlDeviceGetVbiosVersion")["vbios"]
        return value

    # -- memory errors
    def nvmlDeviceGetEccMode(self, h: _Handle) -> List[int]:
        return list(self._dev(h, "nvmlDeviceGetEccMode")["ecc_mode"])

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:
        d = self._dev(h, "nvmlDeviceGetTotalEccErrors")
        scope = "volatile" if counter_type == pynvml.NVML_VOLATILE_ECC else "aggregate"
        kind = "dbe" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "sbe"
        return int(d[f"ecc_{scope}_{kind}"])

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> Tuple[int, ...]:
        d = self._dev(h, "nvmlDeviceGetRemappedRows")
        if d.get("remapped_rows") is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return tuple(int(x) for x in d["remapped_rows"])

    def nvmlDeviceGetRetiredPages(self, h: _Handle, cause: int) -> List[int]:
        d = self._dev(h, "nvmlDeviceGetRetiredPages")
        rp = d.get("retired_pages")
        if rp is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(range(int(rp.get("dbe" if cause else "sbe", 0))))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: _Handle) -> int:
        rp = self._dev(h, "nvmlDeviceGetRetiredPagesPendingStatus").get("retired_pages")
        if rp is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(bool(rp.get("pending", 0)))

    # -- thermal, clocks, power
    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return int(self._dev(h, "nvmlDeviceGetTemperature")["temperature"])

    def nvmlDeviceGetTemperatureThreshold(self, h: _Handle, which: int) -> int:
        d = self._dev(h, "nvmlDeviceGetTemperatureThreshold")
        v = d["temp_slowdown"] if which == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else d["temp_shutdown"]
        if v is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(v)

    def nvmlDeviceGetMarginTemperature(self, h: _Handle) -> int:
        v = self._dev(h, "nvmlDeviceGetMarginTemperature")["temp_margin"]
        if v is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(v)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
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

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetPowerUsage")["power_usage_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetEnforcedPowerLimit")["power_limit_mw"])

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetPowerManagementDefaultLimit")["power_default_mw"])

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> _Util:
        return _Util(int(self._dev(h, "nvmlDeviceGetUtilizationRates")["utilization"]))

    # -- PCIe
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetCurrPcieLinkGeneration")["pcie_gen"])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetMaxPcieLinkGeneration")["pcie_gen_max"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetCurrPcieLinkWidth")["pcie_width"])

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetMaxPcieLinkWidth")["pcie_width_max"])

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetPcieReplayCounter")["pcie_replay"])

    # -- modes, recovery action, fabric
    def nvmlDeviceGetPersistenceMode(self, h: _Handle) -> int:
        return int(self._dev(h, "nvmlDeviceGetPersistenceMode")["persistence"])

    def nvmlDeviceGetMigMode(self, h: _Handle) -> List[int]:
        return list(self._dev(h, "nvmlDeviceGetMigMode")["mig"])

    def nvmlDeviceGetFieldValues(self, h: _Handle, field_ids: Sequence[int]) -> Any:
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

    def nvmlDeviceGetGpuFabricInfoV(self, h: _Handle, info_ref: Any) -> int:
        d = self._dev(h, "nvmlDeviceGetGpuFabricInfoV")
        fab = d.get("fabric")
        if not fab:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = getattr(info_ref, "_obj", info_ref)
        info.state = int(fab.get("state", 3))
        info.status = int(fab.get("status", 0))
        return int(pynvml.NVML_SUCCESS)

    # -- NVLink
    def nvmlDeviceGetNvLinkState(self, h: _Handle, link: int) -> int:
        d = self._dev(h, "nvmlDeviceGetNvLinkState")
        if not d.get("nvlinks"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= int(d["nvlinks"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in (d.get("nvlink_down") or ()) else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: _Handle, link: int, counter: int) -> int:
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
