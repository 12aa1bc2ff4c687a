# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Slurm lab as pytest fixtures.

``slurm_lab`` (session scope) starts the real lab with ``tests/lab/slurm-lab.sh`` (munged + slurmctld +
N slurmd on loopback), exports ``SLURM_CONF`` (and, for the Slurm 24.11 chroot lane, the wrapper directory
first on ``PATH``) into ``os.environ`` so that everything the tests start - scontrol, Ansible modules over
the local connection, the health agent - talks to the lab, and stops the lab by PID at the end of the
session. ``lab`` (function scope) resets the lab first: flags and the health hook removed, every node that is
drained or down resumed, all nodes idle.

Every test that uses them is marked ``@pytest.mark.lab``. Missing Slurm binaries make the fixture FAIL.

Settings come from the lab script's environment variables (SLURM_LAB_PORT_BASE, SLURM_LAB_DIR,
SLURM_LAB_NODES, SLURM_LAB_RELEASE, ...). A lab that was already running before the session (``make lab``)
is reused and left running; one started here is stopped here.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB_SCRIPT = REPO / "tests" / "lab" / "slurm-lab.sh"
HOST_BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch", "srun", "scancel")


class LabError(AssertionError):
    pass


@dataclass
class SlurmLab:
    dir: Path
    conf: Path
    nodes: list
    env: dict
    port_base: int
    release: str
    script: Path = LAB_SCRIPT
    script_env: dict = field(default_factory=dict)

    # ---- commands --------------------------------------------------------------------------------------------
    def run(self, *argv, check: bool = True, timeout: float = 60, input: str | None = None):
        """Run a Slurm client (or any command) with the lab's environment; returns CompletedProcess."""
        env = dict(os.environ)
        env.update(self.env)
        env["LC_ALL"] = "C"
        proc = subprocess.run(
            [str(a) for a in argv], env=env, capture_output=True, text=True, timeout=timeout, input=input,
            check=False)
        if check and proc.returncode != 0:
            raise LabError(f"{' '.join(map(str, argv))} failed rc={proc.returncode}: {proc.stderr.strip()}")
        return proc

    def script_run(self, command: str, check: bool = True, timeout: float = 180, extra_env: dict | None = None):
        env = dict(os.environ)
        env.update(self.script_env)
        env.update(extra_env or {})
        proc = subprocess.run(
            ["bash", str(self.script), command], env=env, capture_output=True, text=True, timeout=timeout,
            check=False)
        if check and proc.returncode != 0:
            raise LabError(f"slurm-lab.sh {command} failed rc={proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    # ---- reading ---------------------------------------------------------------------------------------------
    def node_states(self) -> dict:
        """{node: (sinfo %T state, reason)}; reason is '' when Slurm says none.

        Slurm 24.11 keeps the last reason on a node after RESUME (22.05 clears it): compare states, or the
        reason only while the node is drained/down.
        """
        out = self.run("sinfo", "-h", "-N", "-o", "%N|%T|%E").stdout
        states = {}
        for line in out.splitlines():
            if not line.strip():
                continue
            name, state, reason = line.split("|", 2)
            states[name] = (state, "" if reason == "none" else reason)
        return states

    def wait_for(self, node: str, want, timeout: float = 30, interval: float = 0.1):
        """Poll until ``node``'s (state, reason) satisfies ``want``: a predicate, a state or a set of states."""
        if callable(want):
            pred: Callable = want
        else:
            wanted = {want} if isinstance(want, str) else set(want)

            def pred(state_reason):
                return state_reason[0] in wanted

        deadline = time.monotonic() + timeout
        last = None
        while True:
            last = self.node_states().get(node)
            if last is not None and pred(last):
                return last
            if time.monotonic() >= deadline:
                raise LabError(f"node {node}: {last!r} did not reach {want!r} within {timeout}s")
            time.sleep(interval)

    def wait_all(self, states: Iterable[str] = ("idle",), timeout: float = 60):
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while True:
            current = self.node_states()
            if set(self.nodes) <= set(current) and all(current[n][0] in wanted for n in self.nodes):
                return current
            if time.monotonic() >= deadline:
                raise LabError(f"nodes not {sorted(wanted)} within {timeout}s: {current}")
            time.sleep(0.2)

    def jobs(self) -> list:
        out = self.run("squeue", "-h", "-o", "%A").stdout
        return [j for j in out.split() if j]

    # ---- writing ---------------------------------------------------------------------------------------------
    @property
    def hook(self) -> Path:
        return self.dir / "etc" / "healthcheck.hook"

    def flag(self, node: str, text: str = "flag file") -> Path:
        path = self.dir / "flags" / f"{node}.bad"
        path.write_text(text)
        return path

    def reset(self, timeout: float = 60):
        """Back to a clean lab: no flags, no hook, no jobs, every node idle and resumed."""
        for p in (self.dir / "flags").glob("*"):
            p.unlink()
        for hook in (self.hook, self.dir / "etc" / "epilog.hook"):
            if hook.exists() or hook.is_symlink():
                hook.unlink()
        jobs = self.jobs()
        if jobs:
            self.run("scancel", *jobs, check=False)
            deadline = time.monotonic() + 30
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        deadline = time.monotonic() + timeout
        while True:
            current = self.node_states()
            if set(self.nodes) <= set(current) and all(current[n][0] == "idle" for n in self.nodes):
                return current
            to_resume = [
                n for n, (s, _r) in current.items()
                if n in self.nodes and (s.startswith(("drain", "down", "fail")) or s in ("drained", "draining"))
            ]
            if to_resume:
                self.run("scontrol", "update", f"NodeName={','.join(to_resume)}", "State=RESUME", check=False)
            if time.monotonic() >= deadline:
                raise LabError(f"lab reset: nodes not idle within {timeout}s: {current}")
            time.sleep(0.2)


def _check_prerequisites(release: str):
    if release == "24.11":
        missing = [b for b in ("debootstrap", "unshare", "chroot") if shutil.which(b) is None]
        chroot = Path(os.environ.get("SLURM_LAB_CHROOT", "/var/cache/gpufleet/trixie-chroot"))
        if missing and not (chroot / ".gpufleet-ready").exists():
            pytest.fail(f"Slurm 24.11 lane: no chroot at {chroot} and cannot build one (missing: {missing})")
        return
    missing = [b for b in HOST_BINARIES if shutil.which(b, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
               is None]
    if missing:
        pytest.fail(
            f"Slurm lab prerequisites missing: {', '.join(missing)} (apt-get install munge slurmctld slurmd "
            "slurm-client; `make setup` does it)"
        )


def _parse_env(output: str) -> dict:
    env = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("export "):
            continue
        key, _sep, value = line[len("export "):].partition("=")
        env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
    return env


@pytest.fixture(scope="session")
def slurm_lab():
    release = os.environ.get("SLURM_LAB_RELEASE", "22.05")
    _check_prerequisites(release)
    if os.geteuid() != 0:
        pytest.fail("the Slurm lab runs its daemons as root; run the integration tests as root")
    port_base = int(os.environ.get("SLURM_LAB_PORT_BASE", "16800"))
    lab_dir = Path(os.environ.get("SLURM_LAB_DIR", f"/tmp/gpufleet-lab-{port_base}"))
    nodes_n = int(os.environ.get("SLURM_LAB_NODES", "4"))
    prefix = os.environ.get("SLURM_LAB_NODE_PREFIX", "node")
    script_env = {
        "SLURM_LAB_PORT_BASE": str(port_base),
        "SLURM_LAB_DIR": str(lab_dir),
        "SLURM_LAB_NODES": str(nodes_n),
        "SLURM_LAB_RELEASE": release,
    }
    lab = SlurmLab(
        dir=lab_dir,
        conf=lab_dir / "etc" / "slurm.conf",
        nodes=[f"{prefix}{i}" for i in range(1, nodes_n + 1)],
        env={},
        port_base=port_base,
        release=release,
        script_env=script_env,
    )
    was_running = lab.script_run("status", check=False).returncode == 0
    lab.script_run("start", timeout=900)
    lab.env = _parse_env(lab.script_run("env").stdout)
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
        if not was_running:
            lab.script_run("stop", check=False)


@pytest.fixture
def lab(slurm_lab):
    slurm_lab.reset()
    return slurm_lab
