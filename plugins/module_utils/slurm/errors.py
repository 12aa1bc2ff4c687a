# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one error the Slurm adapter raises, and how a failed command's text is classified."""
from __future__ import annotations

import re
from typing import Any, Dict, Optional

ERROR_KINDS = ("unreachable", "unknown_node", "command", "parse")

UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|Connection refused|"
    r"Communication connection failure|Could not establish a configuration source|"
    r"Unable to process configuration file|Munge (?:encode|decode) failed|munge_encode|Invalid authentication|"
    r"Slurmctld\(\w+\) at \S+ is DOWN",
    re.I,
)
UNKNOWN_NODE = re.compile(r"Invalid node name specified|Node \S+ not found|Unknown node", re.I)


class SlurmError(Exception):
    """A Slurm call failed. ``kind`` is one of ERROR_KINDS."""

    def __init__(self, msg: str, rc: Optional[int] = None, stdout: Optional[str] = "", stderr: Optional[str] = "",
                 kind: str = "command") -> None:
        super().__init__(msg)
        self.msg = msg
        self.rc = rc
        self.stdout = stdout or ""
        self.stderr = stderr or ""
        self.kind = kind if kind in ERROR_KINDS else "command"

    def __str__(self) -> str:
        return self.msg

    def to_dict(self) -> Dict[str, Any]:
        return {"msg": self.msg, "rc": self.rc, "stdout": self.stdout, "stderr": self.stderr, "kind": self.kind}
