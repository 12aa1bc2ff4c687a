# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixture `installed_collection` (session scope): the collection built into a tarball from this checkout and
installed with ansible-galaxy into a separate project directory; see adoption_helpers.InstalledCollection."""

from __future__ import annotations

import json
import subprocess

import pytest
from adoption_helpers import BIN, REPO, InstalledCollection, build_tarball, project_env, tarball_files


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory) -> InstalledCollection:
    base = tmp_path_factory.mktemp("site")
    tarball = build_tarball(REPO, base / "dist")
    project = base / "project"
    collections = project / "collections"
    project.mkdir()
    (project / "ansible.cfg").write_text(
        "[defaults]\ncollections_path = ./collections\ninterpreter_python = auto_silent\n"
        "retry_files_enabled = false\n")
    ansible_env, env = project_env(project, collections)
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(collections),
                           str(tarball)], cwd=project, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = collections / "ansible_collections" / "gpufleet" / "reliability"
    assert (path / "MANIFEST.json").is_file(), proc.stdout
    # Ansible resolves the collection to the installed copy and nowhere else.
    listing = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "list", "gpufleet.reliability",
                              "--format", "json"], cwd=project, env=env, capture_output=True, text=True,
                             timeout=300, check=False)
    assert listing.returncode == 0, listing.stdout + listing.stderr
    found = json.loads(listing.stdout)
    assert list(found) == [str(collections / "ansible_collections")], found
    yield InstalledCollection(project=project, collections=collections, path=path, tarball=tarball,
                              files=tarball_files(tarball), ansible_env=ansible_env, env=env)
