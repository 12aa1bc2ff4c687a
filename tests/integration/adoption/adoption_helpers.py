# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers of the adoption tests (a unique module name: several test folders have a conftest.py).

The collection as a site gets it: `ansible-galaxy collection build` from this checkout, then
`ansible-galaxy collection install` of that tarball into a separate project directory.

Fixture `installed_collection` (session scope, built once): an InstalledCollection with
  project    the site's project directory (its own ansible.cfg; playbooks go here)
  collections  <project>/collections, the only collection path
  path       <project>/collections/ansible_collections/gpufleet/reliability (the installed copy)
  tarball    the built tarball
  files      the tarball's member names (relative to the collection root)
  env        os.environ plus `ansible_env` (for subprocess.run(env=...))
  ansible_env  the ANSIBLE_* variables alone (for ansible_runner.run(envvars=...))
The checkout is on no path Ansible looks at: ANSIBLE_COLLECTIONS_PATH names only the project and
ANSIBLE_COLLECTIONS_SCAN_SYS_PATH is off (the development venv's .pth puts the checkout on sys.path).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


@dataclass
class InstalledCollection:
    project: Path
    collections: Path
    path: Path
    tarball: Path
    files: list = field(default_factory=list)
    ansible_env: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    def run(self, *cmd, timeout=600, check=True, **kw):
        """Run a command (ansible-playbook, ansible-doc...) in the project directory with the project's env."""
        argv = [str(BIN / cmd[0]) if (BIN / cmd[0]).exists() else cmd[0], *cmd[1:]]
        proc = subprocess.run(argv, cwd=kw.pop("cwd", self.project), env=kw.pop("env", self.env),
                              capture_output=True, text=True, timeout=timeout, check=False, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc


def build_tarball(src: Path, dest: Path) -> Path:
    """`ansible-galaxy collection build` of src into dest; returns the tarball."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(dest),
                           str(src)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = yaml.safe_load((src / "galaxy.yml").read_text())
    tarball = dest / f"{meta['namespace']}-{meta['name']}-{meta['version']}.tar.gz"
    assert tarball.is_file(), proc.stdout
    return tarball


def tarball_files(tarball: Path) -> list:
    """The regular files and links in the tarball, relative to the collection root (no MANIFEST/FILES.json)."""
    with tarfile.open(tarball) as tf:
        return sorted(m.name for m in tf.getmembers()
                      if not m.isdir() and m.name not in ("MANIFEST.json", "FILES.json"))


def project_env(project: Path, collections: Path) -> tuple:
    ansible_env = {
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False",
        "ANSIBLE_CONFIG": str(project / "ansible.cfg"),
    }
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_COLLECTIONS_PATHS")}
    env.update(ansible_env)
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    return ansible_env, env
