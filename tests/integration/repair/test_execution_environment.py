# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""AWX / AAP readiness: the playbooks never prompt. (The execution environment and the AWX objects are checked in
tests/integration/adoption/test_awx.py.)"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def test_playbooks_never_prompt():
    for pb in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(pb.read_text()) or []:
            assert "vars_prompt" not in play, f"{pb.name}: vars_prompt makes AWX jobs hang"
            assert "pause" not in str(play.get("tasks", "")), f"{pb.name}: pause prompts"
