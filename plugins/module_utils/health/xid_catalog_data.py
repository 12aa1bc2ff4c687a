# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Xid / SXid catalog as versioned data.

code -> (mnemonic, NVIDIA's Immediate resolution bucket, Investigatory bucket, our severity, our action, sticky).
Source: NVIDIA Xid catalog (Xid-Catalog.xlsx, "Xids" and "Resolution Buckets" sheets;
docs.nvidia.com/deploy/xid-errors). "severity"/"action" are this collection's reading of the
bucket (info = record only). "sticky" = the event stays in view for the sticky window (3 h by default) because
the fault does not clear by itself (NVSentinel's sticky set plus the other node-action Xids).
Site overrides merge per code: config ``xid_overrides: {"94": {"action": "none"}}``.

This is a Python module (not JSON) so that it travels inside AnsiballZ payloads with the rest of the brain.
"""
from __future__ import annotations

CATALOG_VERSION = "2026.12-r590"

# Bucket -> default (severity, action) where an entry does not say otherwise.
BUCKET_DEFAULTS = {
    "RESTART_APP": ("info", "none"),
    "IGNORE": ("info", "none"),
    "RESET_GPU": ("critical", "reset_gpu"),
    "RESTART_BM": ("critical", "reboot"),
    "RESTART_VM": ("critical", "reboot"),
    "CHECK_MECHANICALS": ("critical", "replace"),
    "CONTACT_SUPPORT": ("warning", "monitor"),
    "CHECK_UVM": ("warning", "monitor"),
    "XID_154": ("info", "none"),            # decided by the recovery action the line prints
    "WORKFLOW_XID_13": ("info", "none"),
    "WORKFLOW_XID_31": ("info", "none"),
    "WORKFLOW_XID_45": ("info", "none"),
    "WORKFLOW_XID_48": ("critical", "reset_gpu"),
    "WORKFLOW_NVLINK_ERR": ("critical", "reset_gpu"),
    "WORKFLOW_NVLINK5_ERR": ("info", "none"),  # Fatal/Nonfatal decoded from the line; Xid 154 decides
    "UNKNOWN": ("warning", "monitor"),
}

# code: (name, immediate bucket, investigatory bucket, severity, action, sticky)
XID_CATALOG = {
    8: ("FIFO idle timeout", "RESTART_APP", "CONTACT_SUPPORT", "info", "none", False),
    13: ("Graphics Engine Exception", "RESTART_APP", "WORKFLOW_XID_13", "info", "none", False),
    14: ("Unused (legacy channel error)", "RESTART_APP", "CONTACT_SUPPORT", "info", "none", False),
    31: ("GPU memory page fault (MMU fault)", "RESTART_APP", "WORKFLOW_XID_31", "info", "none", False),
    32: ("Invalid or corrupted push buffer stream (PBDMA)", "RESTART_APP", "CHECK_APP/CUDA", "info", "none", False),
    38: ("Driver firmware error (FECS watchdog)", "IGNORE", "CONTACT_SUPPORT", "info", "none", False),
    43: ("GPU stopped processing (reset channel verification error)", "IGNORE", "CONTACT_SUPPORT", "info", "none",
         False),
    44: ("Graphics engine fault during context switch", "IGNORE", "CONTACT_SUPPORT", "info", "none", False),
    45: ("Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45", "WORKFLOW_XID_45", "info", "none", False),
    46: ("GPU stopped processing (timeout)", "RESET_GPU", "CONTACT_SUPPORT", "critical", "reset_gpu", True),
    48: ("Double Bit ECC Error (DBE)", "WORKFLOW_XID_48", "WORKFLOW_XID_48", "critical", "reset_gpu", True),
    54: ("Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS", "CONTACT_SUPPORT", "critical",
         "replace", True),
    56: ("Display engine error", "CONTACT_SUPPORT", "CONTACT_SUPPORT", "warning", "monitor", False),
    57: ("Error programming video memory interface", "CONTACT_SUPPORT", "CONTACT_SUPPORT", "warning", "monitor", False),
    58: ("Unstable video memory interface detected", "CONTACT_SUPPORT", "CONTACT_SUPPORT", "warning", "monitor", False),
    61: ("Internal micro-controller breakpoint/warning", "CONTACT_SUPPORT", "CONTACT_SUPPORT", "warning", "monitor",
         False),
    62: ("Internal micro-controller halt", "RESET_GPU", "CONTACT_SUPPORT", "critical", "reset_gpu", True),
    63: ("ECC page retirement or row remapping recording event", "IGNORE", "IGNORE", "warning", "reset_gpu", True),
    64: ("ECC page retirement or row remapper recording failure", "RESET_GPU", "CONTACT_SUPPORT", "critical",
         "reset_gpu", True),
    68: ("NVDEC0 Exception", "RESTART_APP", "CONTACT_SUPPORT", "info", "none", False),
    69: ("Graphics Engine class error", "RESTART_APP", "CHECK_APP/CUDA", "info", "none", False),
    74: ("NVLINK Error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", "critical", "reset_gpu", True),
    79: ("GPU has fallen off the bus", "RESTART_BM", "CONTACT_SUPPORT", "critical", "reboot", True),
    80: ("Corrupted data sent to GPU", "RESTART_APP", "CHECK_APP/CUDA", "info", "none", False),
    92: ("High single-bit ECC error rate", "IGNORE", "CONTACT_SUPPORT", "warning", "monitor", False),
    94: ("Contained ECC error", "RESTART_APP", "IGNORE", "warning", "reset_gpu", False),
    95: ("Uncontained ECC error", "RESET_GPU", "IGNORE", "critical", "reset_gpu", True),
    109: ("Context Switch Timeout Error", "RESET_GPU", "CONTACT_SUPPORT", "critical", "reset_gpu", True),
    110: ("Security Fault Error", "RESET_GPU", "INVESTIGATE_SW", "critical", "reset_gpu", True),
    119: ("GSP RPC Timeout", "RESET_GPU", "INVESTIGATE_SW", "critical", "reset_gpu", True),
    120: ("GSP Error", "RESET_GPU", "INVESTIGATE_SW", "critical", "reset_gpu", True),
    121: ("C2C Link corrected error", "IGNORE", "CONTACT_SUPPORT", "info", "none", False),
    136: ("ALI link training failed", "RESET_GPU", "INVESTIGATE_LINK_SI", "critical", "reset_gpu", True),
    137: ("NVLink privilege error (illegal P2P access)", "IGNORE", "XID_137_FLOW", "info", "none", False),
    140: ("ECC unrecovered error escape", "RESET_GPU", "CONTACT_SUPPORT", "critical", "reset_gpu", True),
    143: ("GPU initialization error", "RESET_GPU", "CONTACT_SUPPORT", "critical", "reset_gpu", True),
    144: ("NVLink SAW error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "info", "none", False),
    145: ("NVLink RLW error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "info", "none", False),
    146: ("NVLink TLW error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "info", "none", False),
    147: ("NVLink TREX error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "info", "none", False),
    148: ("NVLink NVLPW_CTRL error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "info", "none", False),
    149: ("NVLink NETIR error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "info", "none", False),
    150: ("NVLink MSE error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "info", "none", False),
    151: ("Key rotation error", "RESTART_VM", "CONTACT_SUPPORT", "critical", "reboot", True),
    154: ("GPU recovery action changed", "XID_154", "informational", "info", "none", False),
    155: ("NVLink SW defined error", "RESET_GPU", "INVESTIGATE_SW_USER", "critical", "reset_gpu", True),
    156: ("Resource retirement event", "RESET_GPU", "IGNORE", "critical", "reset_gpu", True),
    157: ("Resource retirement failure", "IGNORE", "CONTACT_SUPPORT", "warning", "replace", True),
    158: ("GPU fatal timeout", "RESET_GPU", "CONTACT_SUPPORT", "critical", "reset_gpu", True),
    159: ("CHI non-data error", "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO", "warning", "monitor", False),
    160: ("Channel retirement event", "IGNORE", "INVESTIGATE_SW", "info", "none", False),
    161: ("Channel retirement failure", "IGNORE", "INVESTIGATE_SW", "info", "none", False),
    162: ("Power smoothing HW circuitry re-engaged", "IGNORE", "", "info", "none", False),
    163: ("Power smoothing HW circuitry disengaged", "IGNORE", "", "info", "none", False),
    164: ("Power smoothing HW circuitry low lifetime", "CONTACT_SUPPORT", "", "warning", "replace", False),
    165: ("Power smoothing HW circuitry zero lifetime", "CONTACT_SUPPORT", "", "critical", "replace", True),
    167: ("PCIe fatal timeout", "RESTART_BM", "CONTACT_SUPPORT", "critical", "reboot", True),
    168: ("Errors in WPR (reduced memory capacity)", "BOOT_REATTEMPT_OR_ENABLE_ECC", "", "critical", "reboot", True),
    169: ("SEC2 halt (internal micro-controller)", "RESET_GPU", "CONTACT_SUPPORT", "critical", "reset_gpu", True),
    171: ("Uncorrectable DRAM error detail", "WORKFLOW_XID_48", "", "info", "none", False),
    172: ("Uncorrectable SRAM error detail", "WORKFLOW_XID_48", "", "info", "none", False),
}

# NVML nvmlDeviceGpuRecoveryAction_t (field 230, Xid 154 text): value -> (name, severity, action)
RECOVERY_ACTIONS = {
    0: ("None", "info", "none"),
    1: ("GPU Reset Required", "critical", "reset_gpu"),
    2: ("Node Reboot Required", "critical", "reboot"),
    3: ("Drain P2P", "warning", "monitor"),
    4: ("Drain and Reset", "critical", "reset_gpu"),
    5: ("Recover IMEX domain", "critical", "reboot"),
    6: ("Bus Reset", "critical", "reset_gpu"),
    7: ("System Reboot", "critical", "reboot"),
}

# NVSwitch SXids that the Fabric Manager User Guide (appendix D.4) lists as harmless (imbue allowlist).
SXID_HARMLESS = frozenset({11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055, 19057, 19059,
                           19062, 19065, 19068, 19071, 24001, 24002, 24003, 22013})

# SXids that are fatal even when the line carries no "Fatal" word (SOE = NVSwitch management engine).
SXID_CATALOG = {
    26006: ("SOE halted", "critical", "reboot"),
    26007: ("SOE external error", "critical", "reboot"),
    26008: ("SOE watchdog error", "critical", "reboot"),
}
SXID_FATAL_DEFAULT = ("Fatal NVSwitch error", "critical", "reboot")
SXID_NONFATAL_DEFAULT = ("Non-fatal NVSwitch error", "info", "none")
