# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Expected-hardware profiles per GPU model (SKU knowledge from NVIDIA's product data sheets).

A profile says what a healthy GPU of that model looks like, so that a missing feature (NotSupported, N/A) is
a skip where the model lacks it, and a failure only where the model must have it. Sites override fields with
config ``profiles: {"H100": {"power_default_w": 650}}`` or force one with ``profile: H100``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Dict, Mapping, Optional


@dataclass(frozen=True)
class GpuProfile:
    key: str
    match: str                        # regex on the product name
    architecture: str
    pcie_gen: int                     # highest PCIe generation the GPU supports
    pcie_width: int
    nvlinks: int                      # NVLink links on SXM/HGX boards (0 = none expected)
    power_default_w: float            # SXM default power limit
    row_remapping: bool = True        # Ampere+: row remapping instead of page retirement
    fabric_expected: bool = False     # NVSwitch/fabric-manager systems report fabric state Completed
    ecc_expected: bool = True
    temp_warn_c: float = 93.0         # absolute warning when the driver reports no thresholds (cyclecloud)


PROFILES: Dict[str, GpuProfile] = {
    "A100": GpuProfile("A100", r"\bA100\b", "Ampere", pcie_gen=4, pcie_width=16, nvlinks=12, power_default_w=400),
    "H100": GpuProfile("H100", r"\bH100\b", "Hopper", pcie_gen=5, pcie_width=16, nvlinks=18, power_default_w=700,
                       fabric_expected=True),
    "H200": GpuProfile("H200", r"\bH200\b", "Hopper", pcie_gen=5, pcie_width=16, nvlinks=18, power_default_w=700,
                       fabric_expected=True),
    "B200": GpuProfile("B200", r"\bB200\b", "Blackwell", pcie_gen=6, pcie_width=16, nvlinks=18,
                       power_default_w=1000, fabric_expected=True),
    "GB200": GpuProfile("GB200", r"\bGB200\b", "Blackwell", pcie_gen=6, pcie_width=16, nvlinks=18,
                        power_default_w=1200, fabric_expected=True),
}
# GB200 must be tried before B200 (the name "NVIDIA GB200" would also match nothing else, but keep order explicit).
_MATCH_ORDER = ("GB200", "B200", "H200", "H100", "A100")


def build_profiles(overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, GpuProfile]:
    out = dict(PROFILES)
    for key, ov in (overrides or {}).items():
        if not isinstance(ov, Mapping):
            raise ValueError(f"profiles.{key}: expected a mapping of profile fields, got {type(ov).__name__}")
        base = out.get(key) or GpuProfile(key, re.escape(key), "unknown", 0, 0, 0, 0.0)
        fields = set(GpuProfile.__dataclass_fields__) - {"key"}
        bad = sorted(set(ov) - fields)
        if bad:
            raise ValueError(f"profiles.{key}: unknown field(s) {', '.join(bad)} "
                             f"(expected {', '.join(sorted(fields))})")
        out[key] = replace(base, **dict(ov))
    return out


def profile_for(name: Optional[str], profiles: Mapping[str, GpuProfile], forced: Optional[str] = None
                ) -> Optional[GpuProfile]:
    if forced:
        if forced not in profiles:
            raise ValueError(f"profile: unknown GPU profile {forced!r} (expected one of {', '.join(sorted(profiles))})")
        return profiles[forced]
    if not name:
        return None
    order = list(_MATCH_ORDER) + [k for k in profiles if k not in _MATCH_ORDER]
    for key in order:
        p = profiles.get(key)
        if p is not None and re.search(p.match, name):
            return p
    return None
