# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""`pip install` of the installed collection's directory into a clean virtual environment gives working
gpufleet-sim, gpufleet-health, gpufleet-startup and gpufleet-oidc commands: their dependencies declared, the
collection's module_utils inside the wheel, nothing from this checkout on the path. pip reaches PyPI (or its cache)
for simpy, PyYAML, matplotlib and the extras."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import tomllib

pytestmark = pytest.mark.slow


def _run(argv, cwd, env, timeout=900):
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_module_utils_packages_are_all_in_the_wheel_list(installed_collection):
    cfg = tomllib.loads((installed_collection.path / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    prefix = "ansible_collections.gpufleet.reliability.plugins.module_utils"
    root = installed_collection.path / "plugins" / "module_utils"
    found = {prefix} | {f"{prefix}.{p.parent.relative_to(root).as_posix().replace('/', '.')}"
                        for p in root.rglob("*.py") if p.parent != root}
    assert found <= listed, sorted(found - listed)


@pytest.mark.parametrize("what", ["tarball", "installed collection"])
def test_pip_install_gives_working_commands(installed_collection, tmp_path, what):
    if what == "tarball":  # the collection tarball is also an archive pip builds from (pyproject.toml at its top)
        target = installed_collection.tarball
    else:  # pip builds in the source tree: a copy keeps the fixture's installed collection clean
        target = tmp_path / "src"
        shutil.copytree(installed_collection.path, target)
    src = installed_collection.path
    venv = tmp_path / "tools"
    base = getattr(sys, "_base_executable", sys.executable)
    env = {"PATH": f"{venv}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", str(tmp_path)),
           "LANG": "C.UTF-8"}
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE", "PIP_CACHE_DIR",
                "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"):
        if var in os.environ:
            env[var] = os.environ[var]
    r = _run([base, "-m", "venv", venv], tmp_path, env)
    assert r.returncode == 0, r.stderr
    r = _run([venv / "bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
              f"{target}[oidc,nvml]"], tmp_path, env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    work = tmp_path / "work"
    work.mkdir()
    # the brain comes from the venv, not from this checkout or the collection directory
    r = _run([venv / "bin/python", "-c", "import sys; import ansible_collections.gpufleet.reliability.plugins."
              "module_utils.health.engine as e, gpufleet_sim.brain as b; print(e.__file__); print(b.__file__)"],
             work, env)
    assert r.returncode == 0, r.stderr
    assert all(line.startswith(str(venv)) for line in r.stdout.split()), r.stdout

    out = work / "out"
    r = _run(["gpufleet-sim", "run", src / "simulator/scenarios/default-1k.yaml", "--seeds", "1",
              "--policy", "reactive-auto", "reactive-manual", "--out", out], work, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "report.html").is_file() and json.loads((out / "results.json").read_text())["policies"]

    fake = work / "fake.json"
    fake.write_text("{}")
    r = _run(["gpufleet-health", "check", "--fake-nvml", fake, "--kmsg", "-", "--expected-gpus", "8",
              "--state-file", work / "state.json", "--json"], work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["verdict"] == "healthy"

    scripts, state = work / "startup.d", work / "startup-state"
    scripts.mkdir()
    (scripts / "orphan.sh").write_text("#!/bin/sh\necho never\n")
    r = _run(["gpufleet-startup", "run", "--scripts-dir", scripts, "--state-dir", state, "--journal", "off",
              "--json", "-"], work, env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["unmanaged"] == ["orphan.sh"]

    r = _run(["gpufleet-oidc", "--help"], work, env)
    assert r.returncode == 0 and "validate" in r.stdout, r.stderr
