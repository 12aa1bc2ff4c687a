# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boundary, with teeth: who may import whom (scripts/import_map.py reads it from the code), what the brain
may touch, and where a rule's literal may be written. docs/architecture.md's import map is the code's.

Each check has a deliberate violation that makes it fail, and the debts the design still carries are listed here
by name: a new one fails, and so does one that was paid without the list being shortened."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "import_map.py"
spec = importlib.util.spec_from_file_location("import_map", SCRIPT)
import_map = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_map)

MODULE_UTILS = REPO / "plugins" / "module_utils"
BRAIN = ("health/", "repair/")
LEAF = "slurmfacts.py"
#: the leaves: standard library only, nothing of the collection, no I/O
LEAVES = (LEAF, "promtext.py", "spec.py")
#: what the brain may import: itself and the leaves
BRAIN_MAY_IMPORT = set(BRAIN) | set(LEAVES)
#: (unit, what it imports) the design does not want yet (docs/architecture.md, "The import map"); none left
IMPORT_DEBT: set = set()
#: brain files that read or write files or read the clock themselves (a pure brain is given them); none left
IO_DEBT: dict = {}
#: calls that are I/O or the clock: by name, or by module.name ...
IO_CALLS = {"open", "atomic_write", "os.open", "time.time", "time.monotonic", "datetime.now", "os.replace",
            "os.rename", "os.remove", "os.unlink", "os.makedirs"}
#: ... or as a method of any object (pathlib)
IO_METHODS = {"read_text", "write_text", "read_bytes", "write_bytes"}
#: rule literals that live in the leaf only
LITERALS = ("gpufleet:",)


@pytest.fixture(scope="module")
def units():
    return import_map.build()


def test_the_map_in_the_docs_is_the_codes():
    assert import_map.main(["--check"]) == 0, "docs/architecture.md: run scripts/import_map.py --write"


def brain_breaches(units):
    return {(b, i) for b in BRAIN for i in units[b]["imports"] if i not in BRAIN_MAY_IMPORT} | \
        {(b, o) for b in BRAIN for o in units[b]["outside"]}


def test_the_brain_imports_only_itself_and_the_leaf(units):
    assert brain_breaches(units) == IMPORT_DEBT


@pytest.mark.parametrize("leaf", LEAVES)
def test_a_leaf_imports_nothing_of_the_collection_and_reaches_nothing(units, leaf):
    assert units[leaf] == {"imports": set(), "outside": set()}
    assert io_calls(MODULE_UTILS / leaf) == set()


def test_only_bodies_import_a_body(units):
    bodies = {"cli/"}
    assert {(u, i) for u, v in units.items() if u not in bodies | set(import_map.BODIES)
            for i in v["imports"] if i in bodies} == set()


def test_an_adapter_imports_the_repair_brain_only_to_build_its_inputs():
    rels = [p.relative_to(MODULE_UTILS).as_posix() for p in (MODULE_UTILS / "slurm").rglob("*.py")]
    users = sorted(rel for rel in rels
                   if any(f.startswith("repair/") for f in import_map.direct_imports(str(MODULE_UTILS), rel)))
    assert users == ["slurm/repair_inputs.py"]


def io_calls(path):
    """The I/O and clock calls in one file, by the name they are called with (``open``, ``time.time``, ...)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in IO_CALLS:
                found.add(f.id)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and \
                    f"{f.value.id}.{f.attr}" in IO_CALLS:
                found.add(f"{f.value.id}.{f.attr}")
            elif isinstance(f, ast.Attribute) and f.attr in IO_METHODS:
                found.add(f.attr)
    return found


def brain_io(root=MODULE_UTILS):
    return {p.relative_to(root).as_posix(): calls for b in BRAIN for p in sorted((root / b).rglob("*.py"))
            if (calls := io_calls(p))}


def test_the_brain_does_no_io_and_reads_no_clock():
    assert brain_io() == IO_DEBT


def code_strings(path):
    """String constants of a file's code: not docstrings, not the DOCUMENTATION/EXAMPLES/RETURN of a module."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in (
                "DOCUMENTATION", "EXAMPLES", "RETURN") for t in node.targets):
            skip.add(id(node.value))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and
            isinstance(n.value, str) and id(n) not in skip]


def literal_breaches(files, root):
    return sorted(f"{p.relative_to(root).as_posix()}:{line}" for p in files
                  for line, text in code_strings(p) for lit in LITERALS if lit in text)


def python_code():
    for d in (MODULE_UTILS, REPO / "plugins" / "modules", REPO / "plugins" / "action", REPO / "plugins" / "filter",
              REPO / "plugins" / "inventory", REPO / "simulator" / "gpufleet_sim"):
        yield from (p for p in sorted(d.rglob("*.py")) if p != MODULE_UTILS / LEAF)


def test_a_rule_literal_is_written_in_the_leaf_only():
    assert literal_breaches(python_code(), REPO) == []
    assert literal_breaches([MODULE_UTILS / LEAF], REPO) != []  # the control: the leaf has it


def test_each_check_fails_on_a_deliberate_violation(tmp_path):
    """A brain module that imports an adapter and subprocess and opens a file, and a body that spells the prefix."""
    for rel, text in {
        "health/__init__.py": "", "slurmfacts.py": "",
        "health/rules.py": "import subprocess\nfrom .. import kmsg\n\ndef f(p):\n    return open(p).read()\n",
        "kmsg.py": "", "cli/__init__.py": "", "cli/tool.py": "REASON = 'gpufleet: xid79'\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    units = import_map.build(tmp_path, bodies={})
    assert {("health/", "kmsg.py"), ("health/", "subprocess")} <= brain_breaches(dict(units, **{"repair/": {
        "imports": set(), "outside": set()}}))
    assert brain_io(tmp_path) == {"health/rules.py": {"open"}}
    assert literal_breaches([tmp_path / "cli/tool.py"], tmp_path) == ["cli/tool.py:1"]


#: the longest a brain function may be; any still longer would be listed by name (none is)
MAX_LINES = 80
LONG_DEBT: set = set()


def long_functions(root=MODULE_UTILS, limit=MAX_LINES):
    return {f"{p.relative_to(root).as_posix()}:{n.name}" for b in BRAIN for p in sorted((root / b).rglob("*.py"))
            for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > limit}


def test_no_brain_function_is_longer_than_80_lines():
    assert long_functions() == LONG_DEBT
    # 164, 119, 103 and 135 lines before they were split (check_gpu by concern; the kernel events' window out of
    # judge; plan's preparation, breaker and what is on record out of plan; from_dict into a table of fields)
    assert not {"health/rules.py:check_gpu", "health/engine.py:judge", "repair/policy.py:plan",
                "repair/config.py:from_dict"} & long_functions()
    assert "health/rules.py:check_gpu" in long_functions(limit=20)  # the control: the measure sees it
