# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus' text exposition format, written: HELP and TYPE lines, escaped label values, samples bounded to what
float64 holds. A leaf (standard library only, nothing of the collection, no I/O), used by the health report's
metrics (``health/metrics.py``) and the repair run's (``repair/metrics.py``)."""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

Sample = Tuple[Dict[str, Any], Any]


def esc(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


#: The largest magnitude a sample may have (2**63: any counter or reading NVML gives fits; beyond is hostile input).
MAX_SAMPLE = 2 ** 63


def num(v: Any) -> Optional[str]:
    """The sample value as text, or None when ``v`` is not a finite number (hostile or unreadable input)."""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):  # Prometheus samples are float64: a wider integer is refused by promtool and makes
        return str(v) if abs(v) <= MAX_SAMPLE else None  # node_exporter drop every metric of the file
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) and abs(v) <= MAX_SAMPLE else None
    return None


class Writer:
    def __init__(self) -> None:
        self.lines: List[str] = []

    def metric(self, name: str, help_: str, typ: str, samples: Iterable[Sample], always: bool = False) -> None:
        body = []
        for labels, value in samples:
            text = num(value)
            if text is None:
                continue
            lab = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
            body.append(f"{name}{{{lab}}} {text}" if lab else f"{name} {text}")
        if body or always:
            self.lines.append(f"# HELP {name} {help_}")
            self.lines.append(f"# TYPE {name} {typ}")
            self.lines.extend(body)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
