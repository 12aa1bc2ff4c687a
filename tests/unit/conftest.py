# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Cost markers for the unit tests, so that an edit loop can run the pure ones alone.

* ``ansible``: the test meets Ansible (a module run through pytest-ansible's ``localhost``, ansible-playbook through
  ansible-runner, ansible-core's doc-fragment loader or inventory classes, the roles). Every test under
  tests/unit/modules/, tests/unit/roles/ and tests/unit/doc_fragments/ gets it by its path; anywhere else a test gets
  it when it asks for a pytest-ansible fixture, or when its file imports ansible (ansible-core) or ansible_runner or
  names an Ansible command line in quotes ("ansible-playbook", "ansible-doc", ...). A file can also say
  ``pytestmark = pytest.mark.ansible`` itself. These are the tests the ansible-core 2.21 lane runs again (-m ansible).
* ``slow``: a pure test that takes seconds: the full-seed statistical campaigns (the published validation cases,
  whose few-seed smokes run in the fast tier) and the end-to-end runs of a console script in a fresh interpreter.
  Written as ``@pytest.mark.slow`` next to the test (the markers are registered in pyproject.toml).

The fast tier (``make check``) is ``pytest tests/unit -m "not ansible and not slow"``; ``make test`` runs them all.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent
ANSIBLE_DIRS = tuple(UNIT / d for d in ("modules", "roles", "doc_fragments"))
# pytest-ansible's fixtures: each runs a module through Ansible's executor
ANSIBLE_FIXTURES = frozenset({"localhost", "ansible_adhoc", "ansible_module", "ansible_facts"})
# a test file that imports ansible-core or ansible-runner, or names an Ansible command line
ANSIBLE_SOURCE = re.compile(r"^[ \t]*(?:import|from)[ \t]+(?:ansible|ansible_runner)(?:[. \t]|$)"
                            r"|[\"']ansible-(?:playbook|doc|runner|galaxy|test|lint|inventory|console|pull)[\"']",
                            re.MULTILINE)

_source_drives_ansible: dict[Path, bool] = {}


def _drives_ansible(path: Path) -> bool:
    if path not in _source_drives_ansible:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            text = ""
        _source_drives_ansible[path] = bool(ANSIBLE_SOURCE.search(text))
    return _source_drives_ansible[path]


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.path)).resolve()
        if UNIT not in path.parents:
            continue  # not a unit test (tests/integration and the rest carry their own markers)
        if (any(d in path.parents for d in ANSIBLE_DIRS) or ANSIBLE_FIXTURES.intersection(item.fixturenames)
                or _drives_ansible(path)):
            item.add_marker(pytest.mark.ansible)
