# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""YAML from files a person or a capture hands us, read without hanging or crashing the reader.

PyYAML's pure-Python scanner is quadratic in the flow nesting depth (``[[[[...`` of 8 KiB takes seconds) and
libyaml's composer recurses in C (``[`` * 100000 is a segmentation fault, not an exception), so: the flow
nesting is capped before parsing, the safe pure-Python loader parses (a deep block nesting is a RecursionError,
which becomes a ValueError here), and an integer too long to convert is a ValueError too.
"""

from __future__ import annotations

import re
from typing import Any

MAX_FLOW_DEPTH = 64
_BRACKETS = re.compile(r"[\[\]{}]")


def flow_depth(text: str) -> int:
    """Deepest run of unclosed '[' / '{' (quotes not considered: an over-estimate only for odd text)."""
    depth = best = 0
    for m in _BRACKETS.finditer(text):
        if m.group(0) in "[{":
            depth += 1
            best = max(best, depth)
        elif depth:
            depth -= 1
    return best


def load(text: str, what: str = "YAML", max_flow_depth: int = MAX_FLOW_DEPTH) -> Any:
    """yaml.safe_load(text), or ValueError("<what>: ...") for anything that is not plain, sane YAML."""
    try:
        import yaml
    except ImportError:
        raise ValueError(f"{what}: reading YAML needs PyYAML; use JSON")
    depth = flow_depth(text)
    if depth > max_flow_depth:
        raise ValueError(f"{what}: not valid YAML: nested {depth} levels deep (at most {max_flow_depth})")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{what}: not valid YAML: {exc}")
    except RecursionError:
        raise ValueError(f"{what}: not valid YAML: nested too deeply")
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ValueError(f"{what}: not valid YAML: {str(exc)[:120]}")
