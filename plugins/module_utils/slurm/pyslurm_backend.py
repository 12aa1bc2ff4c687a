# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pyslurm client: node reads and state changes through pyslurm's ``Node`` / ``Nodes`` API, and the rule that
picks it. pyslurm builds are tied to one Slurm release, so ``auto`` uses it only when its major.minor equals
``scontrol --version``'s. pyslurm is optional: nothing here imports it before ``import_pyslurm()`` is called."""
from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import UNREACHABLE, SlurmError
from .node import Node, split_state
from .parse import _list, _num, _str

BACKENDS = ("auto", "cli", "pyslurm")


def check_backend(requested: str) -> str:
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of auto, cli, pyslurm; got {requested!r}")
    return requested


def pyslurm_version(mod: Any) -> Optional[Tuple[int, int]]:
    """(major, minor) of an imported pyslurm module, or None."""
    for attr in ("__version__", "version"):
        v = getattr(mod, attr, None)
        if callable(v):
            try:
                v = v()
            except Exception:  # noqa: BLE001 - any failure means "unknown"
                v = None
        if v:
            m = re.match(r"\s*(\d+)\.(\d+)", str(v))
            if m:
                return int(m.group(1)), int(m.group(2))
    return None


def select_backend(requested: str, pyslurm_module: Any,
                   slurm_version: Optional[Sequence[int]]) -> Tuple[str, str]:
    """Decide the backend. Returns (name, why).

    requested: 'auto' | 'cli' | 'pyslurm'; pyslurm_module: the imported module or None;
    slurm_version: (major, minor, micro) from ``scontrol --version`` or None.
    pyslurm's versions mirror Slurm's without the leading zero: pyslurm 22.5.x <-> Slurm 22.05.
    """
    check_backend(requested)
    if requested == "cli":
        return "cli", "requested"
    if pyslurm_module is None:
        if requested == "pyslurm":
            raise SlurmError("backend=pyslurm requested but pyslurm cannot be imported", kind="command")
        return "cli", "pyslurm not importable"
    pv = pyslurm_version(pyslurm_module)
    sv = tuple(slurm_version[:2]) if slurm_version else None
    missing_api = [a for a in ("Node", "Nodes") if not hasattr(pyslurm_module, a)]
    if pv is None or sv is None or pv != sv or missing_api:
        pvs = f"{pv[0]}.{pv[1]}" if pv else "(unknown version)"
        svs = f"{sv[0]}.{sv[1]:02d}" if sv else "(unknown version)"
        why = (f"pyslurm {pvs} lacks {missing_api}" if missing_api
               else f"pyslurm {pvs} does not match Slurm {svs}")
        if requested == "pyslurm":
            raise SlurmError(f"backend=pyslurm unusable: {why}", kind="command")
        return "cli", why
    return "pyslurm", f"pyslurm {pv[0]}.{pv[1]} matches Slurm {sv[0]}.{sv[1]:02d}"


def import_pyslurm() -> Optional[ModuleType]:
    """pyslurm, or None when it cannot be imported here."""
    try:
        return importlib.import_module("pyslurm")
    except Exception:  # noqa: BLE001 - ImportError or a broken build (undefined symbols)
        return None


def _gres_text(value: Any) -> str:
    return ",".join(f"{k}:{v}" for k, v in value.items()) if isinstance(value, dict) else _str(value)


class PyslurmNodes:
    """Node reads and state changes through pyslurm's Node API (only used when it matches Slurm)."""

    def __init__(self, mod: Any) -> None:
        self.mod = mod

    @staticmethod
    def _err(exc: BaseException) -> SlurmError:
        text = str(exc)
        if re.search(r"does not exist|not found|Invalid node name", text, re.I):
            return SlurmError(text, kind="unknown_node")
        if UNREACHABLE.search(text):
            return SlurmError(text, kind="unreachable")
        return SlurmError(f"pyslurm: {text}", kind="command")

    def nodes(self) -> Dict[str, Node]:
        try:
            loaded = self.mod.Nodes.load()
        except Exception as exc:  # noqa: BLE001
            raise self._err(exc)
        out: Dict[str, Node] = {}
        for name in list(loaded):
            n = loaded[name]
            state, flags = split_state(getattr(n, "state", "") or "")
            out[str(name)] = Node(
                name=str(name), state=state, flags=flags, reason=getattr(n, "reason", "") or "",
                reason_user=getattr(n, "reason_user", "") or "",
                reason_time=_num(getattr(n, "reason_time", None)),
                partitions=_list(getattr(n, "partitions", None)),
                features=_list(getattr(n, "active_features", None) or getattr(n, "available_features", None)),
                gres=_gres_text(getattr(n, "configured_gres", {}) or {}),
                gres_used=_gres_text(getattr(n, "allocated_gres", {}) or {}),
                comment=getattr(n, "comment", "") or "", extra=getattr(n, "extra", "") or "",
                boot_time=_num(getattr(n, "boot_time", None)),
            )
        return out

    def modify(self, names: List[str], **changes: Any) -> None:
        """One update RPC for all ``names`` (pyslurm's ``Node(NAMES).modify(changes)`` passes the list to
        slurm_update_node as one node list), as the CLI backend sends one ``scontrol update``: never a loop that
        could stop half way. The caller has checked that every name exists."""
        try:
            self.mod.Node(",".join(names)).modify(self.mod.Node(**changes))
        except Exception as exc:  # noqa: BLE001
            raise self._err(exc)
