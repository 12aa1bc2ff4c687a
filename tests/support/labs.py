# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one lab factory: every Slurm lab a test process starts gets a port block and a directory of its own.

A block is ``BLOCK`` ports from ``base``: slurmctld at base+17, slurmrestd at base+20, slurmd *i* at base+100+i.
Test blocks lie between ``FIRST_BASE`` and ``LAST_BASE`` (below Linux's ephemeral range, 32768 on, so that no
client socket or ``bind(0)`` server takes a lab's port); ``make lab`` uses ``PERSON_BASE``, which no test takes.

A block is reserved by an exclusive ``flock`` on ``<root>/block-<base>.lock``, held by the test process for its
whole life: two test runs, two lanes (22.05 and 24.11) and two pytest-xdist workers never get the same block, and
a block whose process died is free again without anyone cleaning up. The lab directory is ``<root>/lab-<base>``.

A lab carries an owner token (``SLURM_LAB_OWNER``, written to ``<dir>/owner`` by ``slurm-lab.sh start``):
``test:<pid>:<start time>:<random>`` for a test process, ``person:<user>`` for ``make lab``. The lab script refuses
to attach to a running lab with another token, so a test never resets, reuses or stops a lab it did not start.
A block whose directory holds a lab left running by a dead test process (its token's process is gone) is stopped
through the lab script (verified PIDs) before reuse; a block with a live foreign lab, or with any of its ports in
use, is skipped. A block is released only after its lab stopped cleanly (``slurm-lab.sh stop`` removes the owner
file); a lab whose stop failed keeps its block until this process ends, and the next holder reclaims it.

Every reservation, skip, reclaim and release is one line of ``<root>/blocks.log`` (time, PID, token, block, the lock
file's inode, what for): ``make test`` prints its tail when a Slurm lane fails, so a block that two labs used at
once shows who held it and when.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

REPO = Path(__file__).resolve().parents[2]
LAB_SCRIPT = REPO / "tests" / "lab" / "slurm-lab.sh"
ROOT = Path(os.environ.get("GPUFLEET_LAB_ROOT", "/tmp/gpufleet-labs"))
BLOCK = 200
FIRST_BASE = 20000
LAST_BASE = 32400  # base + BLOCK stays below 32768, where Linux's ephemeral ports begin
PERSON_BASE = 16800
HOST_BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch", "srun", "scancel")


class LabError(AssertionError):
    pass


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks): a PID with another start time is another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def process_token(pid: int | None = None) -> str:
    """This process's owner token (stable for the life of the process)."""
    pid = os.getpid() if pid is None else pid
    return f"test:{pid}:{start_time(pid)}:{_RANDOM}"


_RANDOM = secrets.token_hex(4)


def token_alive(token: str) -> bool:
    """Whether the process named by a ``test:`` token still runs; any other token (a person's) counts as alive."""
    parts = token.split(":")
    if len(parts) != 4 or parts[0] != "test" or not parts[1].isdigit():
        return True
    return start_time(int(parts[1])) == parts[2]


def port_busy(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def block_ports(base: int, nodes: int) -> list[int]:
    """slurmctld, slurmdbd, slurmrestd, MariaDB (a lab with accounting), then each slurmd."""
    return [base + 17, base + 19, base + 20, base + 30] + [base + 100 + i for i in range(1, nodes + 1)]


def log_block(event: str, block: int | str, detail: str = "", fd: int | None = None) -> None:
    """One line of ``<root>/blocks.log`` (appended whole: one write with O_APPEND, so lines of processes never mix)."""
    try:
        inode = os.fstat(fd).st_ino if fd is not None else "-"
    except OSError:
        inode = "?"
    line = (f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} pid={os.getpid()} "
            f"block={block} inode={inode} {event}: {detail}".replace("\n", " ") + "\n")
    try:
        log = os.open(ROOT / "blocks.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        os.write(log, line.encode(errors="replace"))
    finally:
        os.close(log)


def read_owner(lab_dir: Path) -> tuple[str, str]:
    """(token, note) from a lab directory's owner file; ('', '') when there is none."""
    try:
        lines = (lab_dir / "owner").read_text().splitlines()
    except OSError:
        return "", ""
    return (lines[0].strip() if lines else ""), (lines[1].strip() if len(lines) > 1 else "")


@dataclass
class Reservation:
    """A port block and directory held by this process (the lock file stays open until ``release``)."""

    base: int
    dir: Path
    purpose: str
    token: str
    _fd: int | None = None

    def script_env(self, nodes: int, release: str, **settings: str) -> dict:
        """The lab script's settings for a lab in this block (SLURM_CONF of another lab is never passed on)."""
        env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
        env.update(SLURM_LAB_PORT_BASE=str(self.base), SLURM_LAB_DIR=str(self.dir), SLURM_LAB_NODES=str(nodes),
                   SLURM_LAB_RELEASE=release, SLURM_LAB_OWNER=self.token,
                   SLURM_LAB_OWNER_NOTE=f"{self.purpose} (pid {os.getpid()}, checkout {REPO})")
        env.update({k: str(v) for k, v in settings.items()})
        return env

    def lost(self) -> str:
        """Why this reservation no longer holds its block ('' while it does): the lock file replaced, or its lock
        taken by another open of the file (a second open in any process must find it locked)."""
        if self._fd is None:
            return "released"
        path = ROOT / f"block-{self.base}.lock"
        try:
            if os.stat(path).st_ino != os.fstat(self._fd).st_ino:
                return f"{path} is another file now"
            probe = os.open(path, os.O_RDONLY)
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return ""
        finally:
            os.close(probe)
        return "its flock was gone"

    def release(self) -> None:
        if self._fd is not None:
            lost = self.lost()
            log_block("release" if not lost else f"release (LOST: {lost})", self.base, self.purpose, self._fd)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def reclaim(lab_dir: Path, nodes: int) -> bool:
    """Stop the lab in ``lab_dir`` when a test process that died left it running (its owner token's process is
    gone); True when there was one. Only for a block whose lock the caller holds: ``reserve`` calls it for each
    block it locks, so the lab is ours now. A lab of a live owner (a person's, another run's) is left alone."""
    holder, _note = read_owner(lab_dir)
    if not holder or token_alive(holder):
        return False
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(SLURM_LAB_DIR=str(lab_dir), SLURM_LAB_NODES=str(nodes))
    proc = subprocess.run(["bash", str(LAB_SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    log_block("reclaim", lab_dir.name, f"stopped the lab of {holder} (rc {proc.returncode})")
    return True


def reserve(purpose: str, nodes: int = 4, base: int | None = None) -> Reservation:
    """A free block for a lab of ``nodes`` nodes; ``base`` (e.g. from SLURM_LAB_PORT_BASE) asks for that block only.

    Fails, naming the holder, when an asked-for block holds a live lab of someone else.
    """
    if nodes > BLOCK - 101:
        raise LabError(f"a lab block holds at most {BLOCK - 101} nodes, asked for {nodes}")
    ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    bases: Iterable[int] = [base] if base is not None else range(FIRST_BASE, LAST_BASE + 1, BLOCK)
    skipped = []
    for b in bases:
        fd = os.open(ROOT / f"block-{b}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = (ROOT / f"block-{b}.lock").read_text().replace("\n", " ").strip()
            log_block("skip", b, f"locked by {holder} ({purpose})")
            if base is not None:
                raise LabError(f"lab port block {b} is reserved by another test process: {holder}; choose another "
                               "SLURM_LAB_PORT_BASE or leave it unset (the factory then picks a free block)")
            skipped.append(f"{b}: reserved by {holder}")
            continue
        lab_dir = ROOT / f"lab-{b}"
        holder, note = read_owner(lab_dir)
        reclaim(lab_dir, nodes)
        busy = [p for p in block_ports(b, nodes) if port_busy(p)]
        if busy:
            os.close(fd)
            who = f"a lab held by {holder!r} ({note})" if holder and token_alive(holder) else "another program"
            log_block("skip", b, f"ports {busy} in use by {who} ({purpose})")
            skipped.append(f"{b}: ports {busy} in use by {who}")
            if base is not None:
                raise LabError(f"lab port block {b} is taken: ports {busy} in use by {who}; choose another "
                               "SLURM_LAB_PORT_BASE or leave it unset (the factory then picks a free block)")
            continue
        token = process_token()
        os.ftruncate(fd, 0)
        os.write(fd, f"{token}\n{purpose}\n".encode())
        log_block("reserve", b, f"{token} {purpose}; the lab directory's owner file named {holder or 'nobody'}", fd)
        return Reservation(base=b, dir=lab_dir, purpose=purpose, token=token, _fd=fd)
    raise LabError(f"no free lab port block between {FIRST_BASE} and {LAST_BASE}: " + "; ".join(skipped[-5:]))


def check_prerequisites(release: str) -> None:
    if release == "24.11":
        missing = [b for b in ("debootstrap", "unshare", "chroot") if shutil.which(b) is None]
        chroot = Path(os.environ.get("SLURM_LAB_CHROOT", "/var/cache/gpufleet/trixie-chroot"))
        if missing and not (chroot / ".gpufleet-ready").exists():
            raise LabError(f"Slurm 24.11 lane: no chroot at {chroot} and cannot build one (missing: {missing})")
        return
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [b for b in HOST_BINARIES if shutil.which(b, path=path) is None]
    if missing:
        raise LabError(f"Slurm lab prerequisites missing: {', '.join(missing)} (apt-get install munge slurmctld "
                       "slurmd slurm-client; `make setup` does it)")
    if os.geteuid() != 0:
        raise LabError("the Slurm lab runs its daemons as root; run the integration tests as root")


def parse_env(output: str) -> dict:
    """``export K=V`` lines of ``slurm-lab.sh env`` as a dict ($PATH expanded from this process's PATH)."""
    env = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("export "):
            continue
        key, _sep, value = line[len("export "):].partition("=")
        env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
    return env


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
    reservation: Reservation | None = None

    # ---- life ------------------------------------------------------------------------------------------------
    def start(self, timeout: float = 900) -> SlurmLab:
        lost = self.reservation.lost() if self.reservation is not None else ""
        if lost:
            raise LabError(f"lab block {self.port_base} is no longer this process's ({lost}); not starting a lab there")
        self.script_run("start", timeout=timeout)
        self.env = parse_env(self.script_run("env").stdout)
        return self

    def stop(self) -> None:
        """Stop the lab; its block is released only when the stop succeeded. A lab that may still run keeps its
        block until this process ends (the next holder then reclaims it): released, its directory would be handed
        to another lab while its daemons, or clients pointed at it, are still there."""
        proc = self.script_run("stop", check=False, timeout=300)
        if self.reservation is None:
            return
        if proc.returncode == 0:
            self.reservation.release()
        else:
            log_block("keep", self.port_base, f"stop failed (rc {proc.returncode}): {proc.stderr[-300:]}",
                      self.reservation._fd)

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
        proc = subprocess.run(  # stdin: the daemons' own is /dev/null, never this process's (tests/conftest.py)
            ["bash", str(self.script), command], env=env, capture_output=True, text=True, timeout=timeout,
            check=False, stdin=subprocess.DEVNULL)
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

    def node_records(self) -> str:
        """Slurm's node records as one JSON line, as a site's cron job dumps them for ``gpufleet-sim calibrate
        --nodes``: ``scontrol show node --json`` (Slurm 23.02 on), ``sinfo --json`` on 22.05."""
        argv = ["scontrol", "show", "node", "--json"] if self.release != "22.05" else ["sinfo", "--json"]
        return json.dumps(json.loads(self.run(*argv).stdout), separators=(",", ":"))

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

    def stop_hooks(self, timeout: float = 120):
        """Remove the health-check and epilog hooks and wait until no check slurmd started before still runs one:
        such a check would write its report, or drain a node, in the next test. A hook must keep its own path in
        its command line while it runs (a shell script that runs its work as a child, not by ``exec``)."""
        hooks = (self.hook, self.dir / "etc" / "epilog.hook")
        for hook in hooks:
            hook.unlink(missing_ok=True)
        deadline = time.monotonic() + timeout
        for hook in hooks:
            while subprocess.run(["pgrep", "-f", str(hook)], capture_output=True, check=False).returncode == 0:
                if time.monotonic() >= deadline:
                    raise LabError(f"checks still running {hook} after {timeout}s")
                time.sleep(0.2)

    def reset(self, timeout: float = 60):
        """Back to a clean lab: no flags, no hook, no jobs, every node idle and resumed."""
        for p in (self.dir / "flags").glob("*"):
            p.unlink()
        self.stop_hooks()
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


def dealt_away(scenarios: list[tuple[str, float]], share: str) -> set[str]:
    """The scenarios (test id and weight, its cost relative to a typical scenario, in collection order) that
    LAB_SHARE ``share`` ('K/N': the K-th of N shares) leaves to the other lanes. The heaviest are dealt first, each to
    the share with the least weight so far (the lowest-numbered on a tie; equal weights in collection order, which
    every pytest-xdist worker shares), so the shares' loads differ by at most one scenario's weight. '' keeps them
    all. ValueError names LAB_SHARE."""
    if not share:
        return set()
    m = re.fullmatch(r"([1-9][0-9]*)/([1-9][0-9]*)", share)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise ValueError(f"LAB_SHARE: expected K/N with 1 <= K <= N (such as 1/2), got {share!r}")
    k, n = int(m.group(1)), int(m.group(2))
    loads = [0.0] * n
    away = set()
    for _i, (test, weight) in sorted(enumerate(scenarios), key=lambda e: (-e[1][1], e[0])):
        to = loads.index(min(loads))
        loads[to] += weight
        if to != k - 1:
            away.add(test)
    return away


def lane_release() -> str:
    return os.environ.get("SLURM_LAB_RELEASE", "22.05")


def new_lab(purpose: str, nodes: int = 4, release: str | None = None, base: int | None = None,
            prefix: str = "node", **settings: str) -> SlurmLab:
    """A lab of this process's own (reserved, not yet started): ``lab.start()``, and ``lab.stop()`` at the end."""
    release = release or lane_release()
    check_prerequisites(release)
    res = reserve(purpose, nodes=nodes, base=base)
    env = res.script_env(nodes, release, SLURM_LAB_NODE_PREFIX=prefix, **settings)
    script_env = {k: v for k, v in env.items() if k.startswith("SLURM_LAB_")}
    return SlurmLab(dir=res.dir, conf=res.dir / "etc" / "slurm.conf",
                    nodes=[f"{prefix}{i}" for i in range(1, nodes + 1)], env={}, port_base=res.base,
                    release=release, script_env=script_env, reservation=res)


@contextlib.contextmanager
def running_lab(purpose: str, nodes: int = 4, **kw):
    """A started lab of this process's own, stopped (by verified PID) and its block released at the end."""
    lab = new_lab(purpose, nodes=nodes, **kw)
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()
