# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter node_files: the module_utils files a node-side command needs, derived from its imports."""
from __future__ import annotations

DOCUMENTATION = r"""
name: node_files
short_description: The module_utils files a node-side entry module imports
description:
  - Reads the entry modules (paths relative to O(root), for example C(cli/health_agent.py)) with Python's C(ast) and
    follows every import of a module of this collection's C(module_utils) - relative imports, and absolute ones
    under C(ansible_collections.gpufleet.reliability.plugins.module_utils) - including the ones inside functions and
    C(try) blocks, transitively. Every package's C(__init__.py) on the way is included (importing a module runs it).
  - The roles that copy code to nodes (gpu_health, startup_scripts, oidc_login, slurm_rest_jwt) take their file
    lists from it, so a new import is shipped without anyone editing a list.
  - Fails, naming the file and the line, when an import names a module that is not there.
author:
  - gpufleet.reliability contributors (@gpufleet)
positional: root
options:
  _input:
    description: The entry modules, relative to O(root).
    type: list
    elements: str
    required: true
  root:
    description: The collection's C(plugins/module_utils) directory on the controller.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Copy the node agent and everything it imports
  ansible.builtin.copy:
    src: "{{ role_path }}/../../plugins/module_utils/{{ item }}"
    dest: "/opt/gpufleet/lib/ansible_collections/gpufleet/reliability/plugins/module_utils/{{ item }}"
    mode: "0644"
  loop: "{{ ['cli/health_agent.py'] | gpufleet.reliability.node_files(role_path ~ '/../../plugins/module_utils') }}"
"""

RETURN = r"""
_value:
  description: The files, relative to O(root), sorted (the entries included).
  type: list
  elements: str
"""

import ast
import os

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the function is also used without Ansible (tests, scripts)
    AnsibleFilterError = ValueError

#: The absolute name of the collection's module_utils (imports under it count as ours).
PACKAGE = "ansible_collections.gpufleet.reliability.plugins.module_utils"


class NodeFilesError(ValueError):
    """An entry or an import that names a module_utils module that is not there."""


def _module_file(root, parts):
    """The file of module ``parts`` (a list of names under root): NAME/__init__.py, else NAME.py (Python's order:
    a package wins over a module of the same name), or None."""
    base = os.path.join(root, *parts)
    for cand in (os.path.join(base, "__init__.py"), base + ".py"):
        if parts and os.path.isfile(cand):
            return cand
    return None


def _imported(root, rel):
    """[(module parts, names imported from it or None, line)] for every import in module_utils file ``rel``."""
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), filename=path)
    package = rel.replace(os.sep, "/").split("/")[:-1]  # a module's package; an __init__.py's is its own
    ours = PACKAGE.split(".")
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level - 1 > len(package):
                raise NodeFilesError(f"{rel}:{node.lineno}: relative import beyond module_utils")
            base = package[:len(package) - (node.level - 1)]
            parts = base + (node.module.split(".") if node.module else [])
            out.append((parts, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = node.module.split(".")
            if names[:len(ours)] == ours:
                out.append((names[len(ours):], [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names = alias.name.split(".")
                if names[:len(ours)] == ours:
                    out.append((names[len(ours):], None, node.lineno))
    return out


def node_files(entries, root):
    """Every module_utils file the ``entries`` import, transitively, relative to ``root``, sorted.

    ``entries``: paths relative to ``root`` (``cli/health_agent.py``). Imports inside functions and ``try`` blocks
    count (a lazy import fails on the node as surely as an eager one); every package ``__init__.py`` above a
    module is included. Raises NodeFilesError naming the file and line of an import that names no module here.
    """
    if isinstance(entries, str):
        entries = [entries]
    root = os.path.abspath(str(root))
    todo = []
    for entry in entries:
        rel = os.path.normpath(str(entry))
        if rel.startswith("..") or os.path.isabs(rel) or not rel.endswith(".py"):
            raise NodeFilesError(f"entry {entry!r}: expected a .py file relative to {root}")
        if not os.path.isfile(os.path.join(root, rel)):
            raise NodeFilesError(f"entry {entry!r}: no such file under {root}")
        todo.append(rel)
    seen = set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        parts = rel.split(os.sep)[:-1]
        for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__.py and a/b/__init__.py
            init = os.path.join(*parts[:depth], "__init__.py")
            if os.path.isfile(os.path.join(root, init)):
                todo.append(init)
        todo.extend(direct_imports(root, rel))
    return sorted(p.replace(os.sep, "/") for p in seen)


def direct_imports(root, rel):
    """The module_utils files that file ``rel`` imports itself (not what they import), relative to ``root``: the
    module of each import and, for ``from PACKAGE import name``, the sub-module ``name`` when there is one. Raises
    NodeFilesError naming the file and line of an import that names no module here."""
    out = []
    for mod, names, line in _imported(root, rel):
        found = _module_file(root, mod)
        if found is None and mod:
            raise NodeFilesError(f"{rel}:{line}: imports {'.'.join(mod)!r}, which is not in {root}")
        if found is not None:
            out.append(os.path.relpath(found, root))
        for name in names or ():
            sub = _module_file(root, mod + [name])  # from ..repair import drain: a sub-module
            if sub is not None:
                out.append(os.path.relpath(sub, root))
    return out


def _filter(entries, root):
    try:
        return node_files(entries, root)
    except (NodeFilesError, OSError, SyntaxError) as exc:
        raise AnsibleFilterError(f"node_files: {exc}") from exc


class FilterModule:
    def filters(self):
        return {"node_files": _filter}
