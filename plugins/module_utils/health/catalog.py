# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lookup over the Xid/SXid catalog data, with per-site overrides merged in."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Mapping, Optional, Tuple

from .report import ACTION_ORDER, SEVERITIES
from .xid_catalog_data import (
    BUCKET_DEFAULTS,
    CATALOG_VERSION,
    RECOVERY_ACTIONS,
    SXID_CATALOG,
    SXID_FATAL_DEFAULT,
    SXID_HARMLESS,
    SXID_NONFATAL_DEFAULT,
    XID_CATALOG,
)


@dataclass(frozen=True)
class XidEntry:
    code: int
    name: str
    bucket: str
    investigatory: str
    severity: str
    action: str
    sticky: bool


def _check_override(field: str, ov: Any) -> Dict[str, Any]:
    if not isinstance(ov, Mapping):
        raise ValueError(f"{field}: expected a mapping of fields, got {type(ov).__name__}")
    out = {}
    for key, value in ov.items():
        if key == "severity":
            if value not in SEVERITIES:
                raise ValueError(f"{field}.severity: expected one of {', '.join(SEVERITIES)}, got {value!r}")
        elif key == "action":
            if value not in ACTION_ORDER:
                raise ValueError(f"{field}.action: expected one of {', '.join(ACTION_ORDER)}, got {value!r}")
        elif key == "sticky":
            if not isinstance(value, bool):
                raise ValueError(f"{field}.sticky: expected true or false, got {value!r}")
        elif key in ("name", "bucket", "investigatory"):
            value = str(value)
        else:
            raise ValueError(f"{field}: unknown key {key!r} (expected name, bucket, investigatory, severity, "
                             "action, sticky)")
        out[key] = value
    return out


class Catalog:
    version = CATALOG_VERSION

    def __init__(self, xid_overrides: Optional[Mapping[Any, Any]] = None,
                 sxid_overrides: Optional[Mapping[Any, Any]] = None):
        self._xid: Dict[int, XidEntry] = {
            code: XidEntry(code, *row) for code, row in XID_CATALOG.items()
        }
        for raw_code, ov in (xid_overrides or {}).items():
            code = _code(raw_code, "xid_overrides")
            fields = _check_override(f"xid_overrides.{code}", ov)
            base = self._xid.get(code) or self._unknown(code)
            self._xid[code] = replace(base, **fields)
        self._sxid_ov: Dict[int, Dict[str, Any]] = {}
        for raw_code, ov in (sxid_overrides or {}).items():
            code = _code(raw_code, "sxid_overrides")
            self._sxid_ov[code] = _check_override(f"sxid_overrides.{code}", ov)

    @staticmethod
    def _unknown(code: int) -> XidEntry:
        sev, act = BUCKET_DEFAULTS["UNKNOWN"]
        return XidEntry(code, f"Xid {code} (not in catalog {CATALOG_VERSION})", "UNKNOWN", "CONTACT_SUPPORT",
                        sev, act, False)

    def xid(self, code: int) -> XidEntry:
        return self._xid.get(code) or self._unknown(code)

    def sxid(self, code: int, fatal: Optional[bool]) -> XidEntry:
        """Entry for an NVSwitch SXid; ``fatal`` from the line text (None when the line does not say)."""
        if code in SXID_CATALOG:
            name, sev, act = SXID_CATALOG[code]
        elif code in SXID_HARMLESS:
            name, sev, act = ("Harmless NVSwitch event (Fabric Manager guide D.4)", "info", "none")
        elif fatal:
            name, sev, act = SXID_FATAL_DEFAULT
        elif fatal is False:
            name, sev, act = SXID_NONFATAL_DEFAULT
        else:
            name, sev, act = ("NVSwitch error of unstated severity", "warning", "monitor")
        entry = XidEntry(code, name, "SXID", "CONTACT_SUPPORT", sev, act, sev == "critical")
        if code in self._sxid_ov:
            entry = replace(entry, **self._sxid_ov[code])
        return entry

    @staticmethod
    def recovery_action(value: int) -> Tuple[str, str, str]:
        return RECOVERY_ACTIONS.get(value, (f"unknown recovery action {value}", "warning", "monitor"))


def _code(raw: Any, field: str) -> int:
    try:
        return int(str(raw).strip())
    except (TypeError, ValueError):
        raise ValueError(f"{field}: keys must be integer codes, got {raw!r}")
