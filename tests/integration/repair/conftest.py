# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixture for the repair lab tests (the helpers are in tests/support/repair_lab.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support.repair_lab import RepairLab


@pytest.fixture
def repair_lab(lab, tmp_path, monkeypatch):
    # ansible-runner finds ansible-playbook on this process's PATH
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + ":" + os.environ.get("PATH", ""))
    rl = RepairLab(lab, tmp_path)
    rl.install()
    try:
        yield rl
    finally:
        rl.uninstall()
        for p in (lab.dir / "faults").glob("*"):
            p.unlink()
        # leave no repair history behind for the next test (the lab's reset does not clear Extra)
        lab.run("scontrol", "update", f"NodeName={','.join(lab.nodes)}", "Extra=", check=False)
