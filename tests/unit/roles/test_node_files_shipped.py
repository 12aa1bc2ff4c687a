# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roles that copy code to nodes ship what the code imports, derived from the imports (filter node_files).

A module missing on the node is an ImportError there - for a lazy import only when that path runs, for example the
agent's drain on the first sick GPU. So each role's copy is laid out as on the node, and a fresh interpreter that
cannot see the checkout imports every shipped module and every module named by any import in them (inside
functions and ``try`` blocks too), with Python's own import machinery, not with the walker under test.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.reliability.plugins.filter.node_files import (
    FilterModule,
    NodeFilesError,
    node_files,
)

REPO = Path(__file__).resolve().parents[3]
MODULE_UTILS = REPO / "plugins" / "module_utils"
PKG = "ansible_collections.gpufleet.reliability.plugins.module_utils"
#: role -> its entry modules (each role lays the files out under its library directory as in the collection)
ROLES = {
    "gpu_health": ["cli/health_agent.py"],
    "startup_scripts": ["cli/startup.py"],
    "oidc_login": ["oidc/pam.py", "cli/oidc.py"],
    "slurm_rest_jwt": ["cli/oidc.py"],
}

# Run by a fresh interpreter: argv[1] the copy's library directory, argv[2:] the shipped files. Prints the problems.
CHECK = r"""
import ast, importlib, importlib.util, os, sys
lib = sys.argv[1]
sys.path[:] = [lib] + [p for p in sys.path
                       if p and not os.path.isdir(os.path.join(p, "ansible_collections", "gpufleet"))]
PKG = "ansible_collections.gpufleet.reliability.plugins.module_utils"
base = os.path.join(lib, *PKG.split("."))
problems = []

def need(name, where):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        problems.append(f"{where}: import {name}: {exc}")
        return None

for rel in sys.argv[2:]:
    name = PKG + "." + rel[:-3].replace("/", ".")
    is_pkg = name.endswith(".__init__")
    name = name[:-len(".__init__")] if is_pkg else name
    mod = need(name, rel)
    if mod is None:
        continue
    if not os.path.abspath(mod.__file__).startswith(base + os.sep):
        problems.append(f"{rel}: imported from {mod.__file__}, not from the copy")
    package = name if is_pkg else name.rpartition(".")[0]
    with open(os.path.join(base, rel), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module
            if not target.startswith(PKG):
                continue
            parent = need(target, f"{rel}:{node.lineno}")
            for alias in node.names if parent is not None else ():
                if not hasattr(parent, alias.name):
                    need(target + "." + alias.name, f"{rel}:{node.lineno}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PKG):
                    need(alias.name, f"{rel}:{node.lineno}")
print("\n".join(problems))
"""


def _role_vars(role):
    return yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text())


def _copy(files, lib):
    dest = lib.joinpath(*PKG.split("."))
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MODULE_UTILS / rel, dest / rel)


def _import_all(lib, files):
    proc = subprocess.run([sys.executable, "-I", "-c", CHECK, str(lib), *files], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _node_code_tasks(role):
    """Every gpufleet.reliability.node_code task of ``role`` (blocks included)."""
    def walk(tasks):
        for task in tasks or []:
            yield from walk(task.get("block")) if "block" in task else [task]
            yield from walk(task.get("rescue"))
            yield from walk(task.get("always"))
    tasks = yaml.safe_load((REPO / "roles" / role / "tasks" / "main.yml").read_text())
    return [t["gpufleet.reliability.node_code"] for t in walk(tasks) if "gpufleet.reliability.node_code" in t]


@pytest.mark.parametrize("role", sorted(ROLES))
def test_role_ships_the_files_derived_from_its_entry_modules(role):
    """The role installs its code with node_code from its entry modules (node_code derives the files with
    node_files), never from a hand-kept list; a list the role keeps for itself is that same derivation."""
    rv = _role_vars(role)
    assert rv[f"{role}_lib_entries"] == ROLES[role]
    tasks = _node_code_tasks(role)
    assert tasks and all(t["entries"] == f"{{{{ {role}_lib_entries }}}}" and t["src"] == f"{{{{ {role}_lib_src }}}}"
                         for t in tasks), tasks
    if f"{role}_lib_files" in rv:
        expr = rv[f"{role}_lib_files"].replace(" ", "")
        assert expr == f"{{{{{role}_lib_entries|gpufleet.reliability.node_files({role}_lib_src)}}}}", \
            f"roles/{role}/vars/main.yml: {role}_lib_files must be derived from the imports, not a hand-kept list"


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_import_of_a_shipped_module_resolves_in_the_copy(role, tmp_path):
    files = node_files(ROLES[role], MODULE_UTILS)
    assert set(ROLES[role]) <= set(files)
    _copy(files, tmp_path / "lib")
    assert _import_all(tmp_path / "lib", files) == ""


def test_a_file_missing_from_the_copy_is_caught(tmp_path):
    """The check above can fail: leave out a module the agent imports only inside a function (its drain rule)."""
    files = node_files(["cli/health_agent.py"], MODULE_UTILS)
    assert "repair/drain.py" in files and "nodeinfo.py" in files  # lazy imports of the agent are shipped
    _copy([f for f in files if f != "repair/drain.py"], tmp_path / "lib")
    out = _import_all(tmp_path / "lib", [f for f in files if f != "repair/drain.py"])
    assert "cli/health_agent.py" in out and "repair.drain" in out, out


def _tree(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_walker_follows_lazy_guarded_package_and_absolute_imports(tmp_path):
    root = _tree(tmp_path, {
        "cli/__init__.py": "",
        "cli/tool.py": ("from .. import util\n"
                        "def run():\n    from ..pkg import sub, NAME\n"
                        "try:\n    from ..opt import thing\nexcept ImportError:\n    thing = None\n"
                        f"import {PKG}.absmod\n"),
        "util.py": "import json\n",
        "pkg/__init__.py": "NAME = 1\nfrom .inner import x\n",
        "pkg/inner.py": "x = 1\n",
        "pkg/sub.py": "",
        "opt.py": "thing = 1\n",
        "absmod.py": "",
        "unused.py": "",
    })
    assert node_files(["cli/tool.py"], root) == [
        "absmod.py", "cli/__init__.py", "cli/tool.py", "opt.py", "pkg/__init__.py", "pkg/inner.py", "pkg/sub.py",
        "util.py"]


def test_walker_prefers_a_package_over_a_module_of_the_same_name(tmp_path):
    root = _tree(tmp_path, {"a.py": "from .b import x\n", "b.py": "x = 1\n", "b/__init__.py": "x = 2\n"})
    assert node_files(["a.py"], root) == ["a.py", "b/__init__.py"]


@pytest.mark.parametrize("text,needle", [
    ("def f():\n    from .gone import x\n", "a.py:2: imports 'gone'"),
    (f"import {PKG}.gone\n", "a.py:1: imports 'gone'"),
    ("from ... import x\n", "beyond module_utils"),
])
def test_walker_names_the_import_that_is_missing(tmp_path, text, needle):
    root = _tree(tmp_path, {"a.py": text})
    with pytest.raises(NodeFilesError) as err:
        node_files(["a.py"], root)
    assert needle in str(err.value)


@pytest.mark.parametrize("entry", ["../etc/passwd.py", "/etc/x.py", "missing.py", "notpython.txt"])
def test_filter_refuses_entries_outside_or_missing(tmp_path, entry):
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="node_files: entry"):
        FilterModule().filters()["node_files"]([entry], str(tmp_path))


def test_filter_returns_relative_sorted_paths():
    out = FilterModule().filters()["node_files"](["cli/startup.py"], str(MODULE_UTILS))
    assert out == sorted(out) and "startup/runner.py" in out and not any(os.path.isabs(p) for p in out)
