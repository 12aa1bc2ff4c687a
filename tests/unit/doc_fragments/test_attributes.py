# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Every module's attributes as Ansible renders them (the module's own block merged with the doc fragments):
# check mode and the POSIX platform fully supported, diff mode stated, each with its description. The fragment
# gpufleet.reliability.attributes carries the descriptions itself; ansible.builtin.action_common_attributes, if a
# module also lists it, must come after it, or its platform support N/A wins.
from __future__ import annotations

from pathlib import Path

import pytest
from ansible.plugins.loader import fragment_loader
from ansible.utils.plugin_docs import get_docstring

REPO = Path(__file__).resolve().parents[3]
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
# What each module says it does in diff mode (a module that reports no diff uses attributes.no_diff).
NO_DIFF = {"gpu_health", "gpu_reset", "node_replace", "repair_plan", "repair_publish"}


def attributes(module: str) -> dict:
    doc, _plain, _returns, _meta = get_docstring(str(REPO / "plugins" / "modules" / f"{module}.py"), fragment_loader,
                                                 collection_name="gpufleet.reliability", is_module=True)
    return doc["attributes"]


@pytest.mark.parametrize("module", MODULES)
def test_module_attributes(module):
    attrs = attributes(module)
    assert attrs["check_mode"]["support"] == "full"
    assert attrs["diff_mode"]["support"] == ("none" if module in NO_DIFF else "full")
    assert attrs["platform"]["support"] == "full"
    assert attrs["platform"]["platforms"] == "posix"
    for name in ("check_mode", "diff_mode", "platform"):
        assert attrs[name]["description"], (module, name)


def test_module_keeps_its_own_details():
    # gpu_reset adds a detail to check_mode over the fragment's support level
    assert attributes("gpu_reset")["check_mode"]["details"].startswith("Checks for processes")


def test_fragment_order_matters(tmp_path):
    # the control: listed after the builtin fragment, ours loses the platform (the builtin says N/A)
    src = (REPO / "plugins" / "modules" / "slurm_conf.py").read_text()
    swapped = src.replace("  - gpufleet.reliability.attributes\n",
                          "  - ansible.builtin.action_common_attributes\n  - gpufleet.reliability.attributes\n")
    assert swapped != src
    path = tmp_path / "slurm_conf.py"
    path.write_text(swapped)
    doc = get_docstring(str(path), fragment_loader, collection_name="gpufleet.reliability", is_module=True)[0]
    assert doc["attributes"]["platform"]["support"] == "N/A"
