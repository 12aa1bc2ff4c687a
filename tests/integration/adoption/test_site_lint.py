# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A site project that installs the collection from its tarball into collections/ and runs ansible-lint (the
production profile, offline, no configuration of its own) finds nothing in it: ansible-lint lints everything
under the project, the installed collection's YAML (simulator scenarios, changelogs, docs) included."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from adoption_helpers import BIN

pytestmark = pytest.mark.slow


def test_ansible_lint_in_a_site_project_finds_nothing_in_the_collection(installed_collection, tmp_path):
    project = tmp_path / "site"
    shutil.copytree(installed_collection.path, project / "collections" / "ansible_collections" / "gpufleet" /
                    "reliability")
    (project / "site.yml").write_text("---\n- name: GPU nodes\n  hosts: gpu\n  gather_facts: false\n  roles:\n"
                                      "    - gpufleet.reliability.gpu_health\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHONPATH"))}
    env["HOME"] = str(tmp_path / "home")
    proc = subprocess.run([str(BIN / "ansible-lint"), "--offline", "--nocolor", "--profile", "production", "-f",
                           "pep8"], cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in proc.stderr, proc.stderr[-3000:]
    # and the check can fail: a scenario with the sequence indentation the collection used to ship
    bad = project / "collections" / "ansible_collections" / "gpufleet" / "reliability" / "simulator" / "scenarios"
    (bad / "bad.yaml").write_text("---\nname: bad\njobs:\n- name: x\n  nodes: 1\n")
    proc = subprocess.run([str(BIN / "ansible-lint"), "--offline", "--nocolor", "--profile", "production", "-f",
                           "pep8", "collections"], cwd=project, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode != 0 and "bad.yaml:4: yaml[indentation]" in proc.stdout, proc.stdout[-3000:]
