# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Slurm lab as pytest fixtures.

``slurm_lab`` (session scope, so once per pytest process: each xdist worker and each lane has its own) starts a
real lab of this process's own through the lab factory (tests/support/labs.py: a reserved port block and directory,
an owner token; munged + slurmctld + N slurmd on loopback), exports ``SLURM_CONF`` (and, for the Slurm 24.11 chroot
lane, the wrapper directory first on ``PATH``) into ``os.environ`` so that everything the tests start - scontrol,
Ansible modules over the local connection, the health agent - talks to the lab, and stops the lab by PID at the
end of the session. ``lab`` (function scope) resets the lab first: flags and the health hook removed, every node
that is drained or down resumed, all nodes idle.

Every test that uses them is marked ``@pytest.mark.lab``. Missing Slurm binaries make the fixture FAIL.

The repair scenarios (marked ``scenario``: a playbook or the agent driven through a fault to its end, minutes each)
go through the same Slurm calls that the adapter, node and step tests check on both releases. ``make test`` runs
the lab suite on both releases in two lanes and deals the scenarios between them (``LAB_SHARE=1/2`` and ``2/2``, set
by scripts/test_lanes.py): the heaviest first (``@pytest.mark.scenario(weight=3)`` names the few that take three
times a typical one), each to the lane with the least so far, so each release runs about half of them and every
other lab test. Without LAB_SHARE (``make integration-lab``, ``make integration-2411``, a file by hand) every
scenario runs.

Settings: SLURM_LAB_RELEASE (22.05 or 24.11), LAB_SHARE (K/N: the K-th of N shares of the scenarios),
SLURM_LAB_NODES [4], SLURM_LAB_NODE_PREFIX [node]; SLURM_LAB_PORT_BASE asks for one block (the factory otherwise
picks a free one). The fixture never attaches to a lab it did not start: a person's ``make lab`` or another run's
lab on the asked-for block is a failure that names its owner.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.labs import LabError, SlurmLab, check_prerequisites, dealt_away, new_lab
from support.shared import run_sshd_dir as shared_run_sshd_dir

__all__ = ["LabError", "SlurmLab"]


# The files that take minutes on a 2-core machine, longest first (measured with --durations). pytest-xdist's
# --dist loadfile hands files to the workers in collection order, so these go first: no worker is left running one
# of them alone at the end of the lane. Every other file keeps its place, and a file's tests their order.
HEAVY_FIRST = (
    "adoption/test_fresh_root.py", "health/test_storm_lab.py", "adoption/test_oidc_login_rollback.py",
    "health/test_gpu_health_role.py", "adoption/test_nhc_coexist.py", "oidc/test_oidc_login_role.py",
    "test_startup_scripts_role.py", "adoption/test_tools_venv.py", "test_startup_lab.py", "health/test_health_lab.py",
    "test_slurm_node_lab.py", "test_slurm_reliability.py",
)
HERE = Path(__file__).resolve().parent


def scenario_weight(item) -> float:
    """A scenario's cost against a typical one (``@pytest.mark.scenario(weight=3)``; 1 without)."""
    return float(item.get_closest_marker("scenario").kwargs.get("weight", 1))


def pytest_collection_modifyitems(config, items):
    try:
        dealt = dealt_away([(it.nodeid, scenario_weight(it)) for it in items if it.get_closest_marker("scenario")],
                           os.environ.get("LAB_SHARE", ""))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if dealt:
        config.hook.pytest_deselected(items=[it for it in items if it.nodeid in dealt])
        items[:] = [it for it in items if it.nodeid not in dealt]

    def rank(item) -> int:
        try:
            rel = Path(item.path).resolve().relative_to(HERE).as_posix()
        except ValueError:
            return len(HEAVY_FIRST)
        return HEAVY_FIRST.index(rel) if rel in HEAVY_FIRST else len(HEAVY_FIRST)

    items.sort(key=rank)  # a stable sort


@pytest.fixture(scope="session")
def slurm_lab():
    release = os.environ.get("SLURM_LAB_RELEASE", "22.05")
    try:
        check_prerequisites(release)
        base = os.environ.get("SLURM_LAB_PORT_BASE")
        lab = new_lab("the session lab of pytest", nodes=int(os.environ.get("SLURM_LAB_NODES", "4")),
                      release=release, base=int(base) if base else None,
                      prefix=os.environ.get("SLURM_LAB_NODE_PREFIX", "node"))
    except LabError as exc:
        pytest.fail(str(exc))
    try:
        lab.start()
        saved = {k: os.environ.get(k) for k in lab.env}
        os.environ.update(lab.env)
        try:
            yield lab
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    finally:
        lab.stop()


@pytest.fixture
def run_sshd_dir():
    """sshd (even `sshd -t`) needs its privilege-separation directory /run/sshd: made if missing, and removed (if a
    test made it) only when no test process uses it any more (tests/support/shared.py)."""
    with shared_run_sshd_dir():
        yield


@pytest.fixture
def lab(slurm_lab):
    slurm_lab.reset()
    return slurm_lab
