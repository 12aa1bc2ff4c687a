# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm hostlist expressions (``gpu[001-064],spare3``): checked splitting, and a local expansion for where no
``scontrol`` exists (AWX execution environments). The CLI client expands through ``scontrol show hostnames``."""
from __future__ import annotations

import re
from typing import List, Sequence, Union

HostlistExpr = Union[str, Sequence[str]]

_HOSTLIST_OK = re.compile(r"^[A-Za-z0-9_.\-]+(\[[0-9,\-]+\][A-Za-z0-9_.\-]*)*$")


def split_hostlist_expr(expr: HostlistExpr) -> List[str]:
    """Split a hostlist expression at top-level commas, checking brackets; returns the parts."""
    if isinstance(expr, (list, tuple)):
        out: List[str] = []
        for e in expr:
            out.extend(split_hostlist_expr(e))
        return out
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError("a node name or hostlist expression is required (got an empty value)")
    parts: List[str] = []
    depth, cur = 0, ""
    for ch in expr.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"invalid hostlist expression {expr!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"invalid hostlist expression {expr!r}: unbalanced '['")
    parts.append(cur)
    parts = [p.strip() for p in parts if p.strip()]
    for p in parts:
        if not _HOSTLIST_OK.match(p):
            raise ValueError(f"invalid node name or hostlist {p!r} in {expr!r}")
    return parts


def unique(names: Sequence[str]) -> List[str]:
    """``names`` without repeats, in first-seen order."""
    out: List[str] = []
    seen = set()
    for n in names:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


def expand_hostlist_local(expr: HostlistExpr) -> List[str]:
    """Pure-Python hostlist expansion for where no scontrol exists (AWX): 'gpu[01-03,7]x,n1' ->
    ['gpu01x', 'gpu02x', 'gpu03x', 'gpu7x', 'n1']. Several bracket groups multiply out, as in Slurm."""
    out: List[str] = []
    for part in split_hostlist_expr(expr):
        names = [""]
        for text, inner in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
            choices = [text]
            if inner:
                choices = []
                for rng in inner.split(","):
                    if "-" in rng:
                        a, b = rng.split("-", 1)
                        if not (a.isdigit() and b.isdigit()) or int(b) < int(a):
                            raise ValueError(f"invalid range {rng!r} in hostlist {part!r}")
                        width = len(a) if a.startswith("0") else 0
                        choices += [f"{text}{i:0{width}d}" for i in range(int(a), int(b) + 1)]
                    elif rng.isdigit():
                        choices.append(text + rng)
                    else:
                        raise ValueError(f"invalid range {rng!r} in hostlist {part!r}")
            names = [n + c for n in names for c in choices]
        out.extend(n for n in names if n)
    return unique(out)
