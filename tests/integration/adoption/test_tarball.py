# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The built tarball holds what git tracks and nothing a used checkout grows (node_modules at any depth, out/,
.venv*, caches, egg-info); the installed collection answers ansible-doc from the project, not the checkout."""

from __future__ import annotations

import json
import shutil
import subprocess

from adoption_helpers import REPO, build_tarball, tarball_files

# Tracked files that are development machinery, not the collection (galaxy.yml: in MANIFEST.json; tests/thirdparty
# and benchmarks/thirdparty: third-party software the test suite and the benchmarks run).
NOT_SHIPPED_TRACKED = (".gitignore", ".ansible-lint", ".ci/", "galaxy.yml", "tests/thirdparty/",
                       "benchmarks/thirdparty/", "changelogs/fragments/",  # fragments: unreleased notes
                       "docs/awx/objects.yml")  # needs awx.awx: a site project's ansible-lint fails on it

# What a checkout grows after `make setup`, `make demo`, `make test` and ansible-test, at several depths.
GROWN = [
    "tests/idp/node_modules/jose/package.json",
    "node_modules/left-pad/index.js",
    "tests/integration/oidc/node_modules/x/y/z.js",
    "out/demo/report.html",
    "out/demo/results.csv",
    ".venv/bin/python",
    ".venv-2.21/lib/python3.12/site-packages/x.py",
    "tests/.venv/pyvenv.cfg",
    ".pytest_cache/v/cache/nodeids",
    "tests/unit/.pytest_cache/README.md",
    "simulator/.ruff_cache/0.1/x",
    ".hypothesis/examples/ab/cd",
    "tests/unit/health/.hypothesis/examples/x",
    "simulator/gpufleet_reliability_tools.egg-info/PKG-INFO",
    "plugins/module_utils/health/__pycache__/engine.cpython-311.pyc",
    "tests/output/.tmp/sanity/x.txt",
    ".cache/lock-venv/bin/pip",
    ".lab/slurm/slurm.conf",
    ".build/ansible_collections/x",
    "build/lib/gpufleet_sim/cli.py",
    "dist/gpufleet_reliability_tools-0.1.0-py3-none-any.whl",
    "gpufleet-reliability-0.0.9.tar.gz",
    ".coverage",
    "changelogs/.plugin-cache.yaml",
]


def tracked_files() -> list:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                         check=True).stdout.decode()
    return sorted(p for p in out.split("\0") if p and (REPO / p).is_file())


def expected_files(tracked: list) -> list:
    return sorted(p for p in tracked if not p.startswith(NOT_SHIPPED_TRACKED))


def test_used_checkout_builds_the_clean_file_list(tmp_path):
    tracked = tracked_files()
    src = tmp_path / "checkout"
    for rel in tracked:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    clean = tarball_files(build_tarball(src, tmp_path / "clean"))
    for rel in GROWN:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("grown by use\n")
    (src / "collections/ansible_collections/gpufleet").mkdir(parents=True)
    (src / "collections/ansible_collections/gpufleet/reliability").symlink_to("../../..")
    used = tarball_files(build_tarball(src, tmp_path / "used"))
    assert used == clean
    assert clean == expected_files(tracked)
    assert not [p for p in used if "node_modules" in p or p.startswith(("out/", ".venv"))]


def test_tarball_of_this_checkout_has_only_tracked_files(installed_collection):
    # This checkout has been used (tests/idp/node_modules after `make setup`, .venv, caches).
    shipped = installed_collection.files
    assert shipped == expected_files(tracked_files())
    for must in ("meta/runtime.yml", "plugins/modules/gpu_health.py", "roles/gpu_health/tasks/main.yml",
                 "playbooks/repair.yml", "README.md", "LICENSE", "changelogs/changelog.yaml"):
        assert must in shipped, must
    assert not [f for f in shipped if f.startswith("changelogs/fragments/")]  # unreleased notes stay home
    manifest = json.loads((installed_collection.path / "MANIFEST.json").read_text())["collection_info"]
    for key in ("repository", "documentation", "homepage", "issues"):  # Galaxy links these; empty was an issue
        assert (manifest.get(key) or "").startswith("https://"), (key, manifest.get(key))


def test_installed_collection_answers_from_the_project(installed_collection):
    ic = installed_collection
    doc = json.loads(ic.run("ansible-doc", "-j", "gpufleet.reliability.gpu_health").stdout)
    filename = doc["gpufleet.reliability.gpu_health"]["doc"]["filename"]
    assert filename.startswith(str(ic.path)), filename
    roles = ic.run("ansible-doc", "-t", "role", "-l", "gpufleet.reliability").stdout
    for role in ("gpu_health", "startup_scripts", "slurm_reliability", "oidc_login", "node_repair"):
        assert f"gpufleet.reliability.{role}" in roles, roles
