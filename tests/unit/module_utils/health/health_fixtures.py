# Helpers for the health-brain tests: fixture loading with the attribution headers stripped.
from __future__ import annotations

import re
from pathlib import Path

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
