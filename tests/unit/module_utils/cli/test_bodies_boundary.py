# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bodies out of the brain: nothing in health/, repair/, oidc/ or startup/ imports a body (cli/), not even through
an adapter (slurm, nvml, ...) that would import one; and the command lines live in cli/, not in those packages."""
import ast
from pathlib import Path

import pytest

from ansible_collections.gpufleet.reliability.plugins.filter.node_files import node_files

MODULE_UTILS = Path(__file__).resolve().parents[4] / "plugins" / "module_utils"
CORE = ("health", "repair", "oidc", "startup")
BODIES = "cli/"


def _core_files():
    return sorted(str(p.relative_to(MODULE_UTILS)) for pkg in CORE for p in (MODULE_UTILS / pkg).rglob("*.py"))


def _bodies_in_closure(rel, root=MODULE_UTILS):
    return [f for f in node_files([rel], root) if f.startswith(BODIES)]


@pytest.mark.parametrize("rel", _core_files())
def test_core_module_imports_no_body_even_through_an_adapter(rel):
    assert _bodies_in_closure(rel) == [], f"{rel} imports a body (directly or through what it imports)"


@pytest.mark.parametrize("rel", _core_files())
def test_core_module_has_no_command_line(rel):
    tree = ast.parse((MODULE_UTILS / rel).read_text())
    mains = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    dunder = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert not mains and not dunder, f"{rel}: a command line belongs in {BODIES} (a body), not in the brain"


def test_the_check_catches_a_body_imported_through_an_adapter(tmp_path):
    """health/x -> adapter.py (lazily) -> cli/tool.py: caught, although health/x never names cli/."""
    for rel, text in {"health/__init__.py": "", "health/x.py": "def f():\n    from .. import adapter\n",
                      "adapter.py": "from .cli import tool\n", "cli/__init__.py": "", "cli/tool.py": ""}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert _bodies_in_closure("health/x.py", tmp_path) == ["cli/__init__.py", "cli/tool.py"]


def test_each_console_script_is_a_body():
    import tomllib  # Python 3.11+, the test venv's

    scripts = tomllib.loads((MODULE_UTILS.parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    prefix = "ansible_collections.gpufleet.reliability.plugins.module_utils."
    ours = {k: v for k, v in scripts.items() if v.startswith(prefix)}
    assert set(ours) == {"gpufleet-health", "gpufleet-oidc", "gpufleet-startup"}
    for name, target in ours.items():
        module = target[len(prefix):].split(":")[0]
        assert module.startswith("cli."), f"{name} -> {target}: console scripts point at the bodies package"
        assert (MODULE_UTILS / (module.replace(".", "/") + ".py")).is_file(), target
