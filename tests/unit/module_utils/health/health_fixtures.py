# Helpers for the health-brain tests: fixture loading with the attribution headers stripped, and synthetic
# snapshots (a healthy H100 GPU, a node of them) that the rule tests vary one field at a time.
from __future__ import annotations

import re
from pathlib import Path

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import GpuSnapshot, Snapshot

GPU_FIXTURES = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "gpu"


def strip_header(text: str) -> str:
    """Drop the leading '# ' header (through the '# ---- verbatim ...' marker) and '# from:' lines."""
    lines = text.splitlines()
    out = []
    in_header = True
    for line in lines:
        if in_header:
            if line.startswith("#"):
                continue
            in_header = False
        if line.startswith("# from:"):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def load(name: str) -> str:
    text = (GPU_FIXTURES / name).read_text(encoding="utf-8")
    return text if name.endswith(".xml") else strip_header(text)


def blocks(name: str):
    """[(source, text)] for files assembled from '# from:' blocks."""
    text = (GPU_FIXTURES / name).read_text(encoding="utf-8")
    out = []
    cur = None
    for line in text.splitlines():
        m = re.match(r"# from: (.*)", line)
        if m:
            cur = [m.group(1), []]
            out.append(cur)
        elif cur is not None and not line.startswith("#"):
            cur[1].append(line)
    return [(src, "\n".join(body) + "\n") for src, body in out]


def h100(index=0, **kw):
    """A healthy H100 SXM GPU; keyword arguments override fields (``name=`` makes it another model)."""
    base = dict(index=index, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{index}",
                pci_bus_id=f"00000000:{0x10 + index:02x}:00.0",
                ecc_enabled=True, ecc_pending_enabled=True, ecc_volatile_sbe=0, ecc_volatile_dbe=0,
                remapped_rows_pending=False, remapped_rows_failure=False, remapped_rows_uncorrectable=0,
                temperature=40, temp_tlimit=40, clocks_event_reasons=["gpu_idle"], power_draw=70, power_limit=700,
                power_default_limit=700, pcie_gen_current=5, pcie_gen_max=5, pcie_width_current=16,
                pcie_width_max=16, pcie_replay_counter=100, recovery_action=0, persistence_mode=True,
                fabric_state="Completed", fabric_status="Success")
    base.update(kw)
    return GpuSnapshot(**base)


def node(*gpus, **kw):
    """A node of the given GPUs (default: 8 healthy H100s), driver 580.105.08; keyword arguments go to Snapshot."""
    return Snapshot(gpus=list(gpus) or [h100(i) for i in range(8)], driver_version="580.105.08", **kw)
