# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health brain: snapshot model, Xid catalog, kmsg parser, nvidia-smi readers, rules, report.

Pure Python (stdlib only, 3.9+). Public API::

    from .health import judge, Report, Finding, ACTION_ORDER, parse_kmsg, read_nvidia_smi_xml, read_nvidia_smi_text
"""
from __future__ import annotations

from .catalog import Catalog
from .config import CHECKS, DEFAULT_THRESHOLDS, Config
from .engine import judge
from .kmsg_parse import group_bursts, parse_kmsg
from .model import GpuSnapshot, IbPort, KernelEvent, Mount, NvLinkInfo, Snapshot, normalize_pci
from .profiles import PROFILES, GpuProfile
from .report import ACTION_ORDER, EXIT_CODES, SEVERITIES, VERDICTS, Finding, Report
from .smi import read_nvidia_smi_text, read_nvidia_smi_xml
from .xid_catalog_data import CATALOG_VERSION

__all__ = [
    "ACTION_ORDER", "CATALOG_VERSION", "CHECKS", "DEFAULT_THRESHOLDS", "EXIT_CODES", "PROFILES", "SEVERITIES",
    "VERDICTS", "Catalog", "Config", "Finding", "GpuProfile", "GpuSnapshot", "IbPort", "KernelEvent", "Mount",
    "NvLinkInfo", "Report", "Snapshot", "group_bursts", "judge", "normalize_pci", "parse_kmsg",
    "read_nvidia_smi_text", "read_nvidia_smi_xml",
]
