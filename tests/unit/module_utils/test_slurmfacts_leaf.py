# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm node facts live once, in the leaf ``slurmfacts.py``: it imports nothing of the collection, the Slurm
adapter reaches it without the repair policy, and the reason prefix is written nowhere else in code (docstrings
and the modules' DOCUMENTATION / EXAMPLES / RETURN text excepted). A deliberate violation shows each check fails."""
import ast
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.reliability.plugins.filter.node_files import node_files
from ansible_collections.gpufleet.reliability.plugins.module_utils import slurmfacts
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.report import Finding, Report

REPO = Path(__file__).resolve().parents[3]
MODULE_UTILS = REPO / "plugins" / "module_utils"
LEAF = MODULE_UTILS / "slurmfacts.py"
CODE = [REPO / "plugins", REPO / "simulator" / "gpufleet_sim"]
ANSIBLE_DOCS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}


def prefix_literals(path: Path, root: Path = REPO):
    """String constants that hold the reason prefix, outside docstrings and Ansible's documentation strings."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ANSIBLE_DOCS for t in node.targets):
            skip.add(id(node.value))
    return [f"{path.relative_to(root)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and slurmfacts.REASON_PREFIX in node.value]


def test_the_leaf_imports_nothing_of_the_collection():
    tree = ast.parse(LEAF.read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    # the standard library only (a leaf: nothing of the collection, nothing installed)
    names = [a.name for n in imports if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in imports if isinstance(n, ast.ImportFrom) and n.level == 0]
    assert all(isinstance(n, ast.Import) or n.level == 0 for n in imports), [ast.unparse(n) for n in imports]
    assert all(name.split(".")[0] in sys.stdlib_module_names for name in names), names
    assert node_files(["slurmfacts.py"], MODULE_UTILS) == ["slurmfacts.py"]


def test_the_slurm_adapter_does_not_need_the_repair_policy():
    shipped = node_files(["slurm/node.py", "slurm/waiters.py"], MODULE_UTILS)
    assert not [f for f in shipped if f.startswith("repair/")], shipped


def test_the_reason_prefix_is_written_once():
    found = [hit for root in CODE for p in sorted(root.rglob("*.py")) if p != LEAF for hit in prefix_literals(p)]
    assert found == [], "write slurmfacts.REASON_PREFIX (or a name built from it), not the literal:\n" + \
        "\n".join(found)
    assert len(prefix_literals(LEAF)) == 1


def test_the_check_catches_a_copy_of_the_prefix(tmp_path):
    bad = tmp_path / "body.py"
    bad.write_text('"""Drains with reason gpufleet: x (a docstring may say it)."""\n'
                   'DOCUMENTATION = "reason_prefix: gpufleet:"\n'
                   'def drain(code):\n    return "gpufleet: " + code\n')
    assert [h.split(": ", 1)[1] for h in prefix_literals(bad, tmp_path)] == ["'gpufleet: '"]


@pytest.mark.parametrize("finding,want", [
    (Finding("xid", "critical", "fallen off the bus", "reboot", "xid79", 3), "gpufleet: xid79 gpu3"),
    (Finding("pci", "critical", "link down", "reboot", "pcie_link", None, pci="0000:86:00.0"),
     "gpufleet: pcie_link 0000:86:00.0"),
])
def test_the_health_report_uses_the_one_reason_format(finding, want):
    assert Report([finding]).drain_reason() == want == slurmfacts.drain_reason(finding.code, finding.gpu, finding.pci)
    assert Report([]).drain_reason() == slurmfacts.drain_reason("ok") == "gpufleet: ok"


def test_the_roles_filter_gives_the_same_reason():
    from ansible_collections.gpufleet.reliability.plugins.filter.drain_reason import FilterModule

    f = FilterModule().filters()["drain_reason"]
    assert f("xid79", 3) == slurmfacts.drain_reason("xid79", 3) == "gpufleet: xid79 gpu3"
    assert f("node_power_brake", None, "site-gpufleet:") == "site-gpufleet: node_power_brake"


@pytest.mark.parametrize("state,flags,reason,failed,want", [
    # a failed startup drains a node that is only DOWN (the usual state before slurmd registers) or in service
    ("down", (), "Not responding", "gpufleet: startup 10-gpu", ("drain", "gpufleet: startup 10-gpu")),
    ("idle", (), "", "gpufleet: startup 10-gpu", ("drain", "gpufleet: startup 10-gpu")),
    # ... keeps someone else's drain or failure, and our own drain with the same reason
    ("idle", ("DRAIN",), "ops: cable", "gpufleet: startup 10-gpu", ("kept", "ops: cable")),
    ("down", ("FAIL",), "ops: dimm", "gpufleet: startup 10-gpu", ("kept", "ops: dimm")),
    ("DRAINED", (), "ops: cable", "gpufleet: startup 10-gpu", ("kept", "ops: cable")),
    ("idle", ("DRAIN",), "gpufleet: startup 10-gpu", "gpufleet: startup 10-gpu", ("kept", "gpufleet: startup 10-gpu")),
    # ... and replaces our own drain of another script
    ("idle", ("DRAIN",), "gpufleet: startup 20-ib", "gpufleet: startup 10-gpu", ("drain", "gpufleet: startup 10-gpu")),
    # a success takes back only the runner's own drain
    ("down", ("DRAIN",), "gpufleet: startup 10-gpu", None, ("resume", "gpufleet: startup 10-gpu")),
    ("idle", ("DRAIN",), "gpufleet: xid79 gpu3", None, ("kept", "gpufleet: xid79 gpu3")),
    ("idle+drain", (), "ops: cable", None, ("kept", "ops: cable")),
    ("down", (), "Not responding", None, ("none", None)),
])
def test_startup_action_is_the_runners_rule(state, flags, reason, failed, want):
    assert slurmfacts.startup_action(state, flags, reason, failed) == want


def test_reason_code_reads_back_what_drain_reason_writes():
    for code, gpu, pci in (("xid79", 3, None), ("nvml_missing", None, None), ("xid48", None, "0000:18:00")):
        assert slurmfacts.reason_code(slurmfacts.drain_reason(code, gpu, pci)) == code
    assert slurmfacts.reason_code("ops: cable") is None and slurmfacts.reason_code("gpufleet:") == ""
