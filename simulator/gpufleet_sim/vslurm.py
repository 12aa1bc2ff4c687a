"""The simulator's virtual Slurm: the one place the engine changes a node's Slurm record.

A record is the repair policy's typed input (``repair.NodeState``), kept with the node's repair history for the
node's life. On a real cluster these fields change only through Slurm: a drain or resume a body asks for
(``slurm.SlurmClient.drain`` / ``resume``: state flags, the reason, who set it and when), a job that starts or
leaves the node (allocated / idle), slurmctld marking a node that stopped answering DOWN ("Not responding"), and
the agent's report beside it. The engine asks for those events here and never writes a record's fields itself, so
what the brain reads is what Slurm would show after the same events.

``drain`` and ``resume`` take names, as the Slurm adapter's client does; the other events are Slurm's own.

When asked (``Sim.keep_records``) it also keeps what slurmdbd would record of those events (``events``:
``sacctmgr show event``'s node events: the node, when it went out of service and came back, DRAIN or DOWN, the
reason and who set it), which ``gpufleet-sim run --export-history`` writes out for ``gpufleet-sim calibrate``.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import NodeState
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import dumps

DRAIN = frozenset({"DRAIN"})
NO_FLAGS: frozenset = frozenset()
NOT_RESPONDING = "Not responding"


class VirtualSlurm:
    """Slurm's node records of one simulated cluster. ``clock()`` gives the time as epoch seconds (reason times)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.records: Dict[str, NodeState] = {}
        #: node events as slurmdbd keeps them: [node, start, end (None: still out), state, reason, user], when a
        #: list (``Sim.keep_records``, for ``--export-history``); None keeps nothing (no result reads them)
        self.events: Optional[List[list]] = None
        self._open: Dict[str, list] = {}
        #: every write of a node's repair history as (time, node, its text in Slurm's field) when a list
        #: (``--export-history`` sets it: what a site's dumps of its node records would show); None keeps nothing
        self.history_log: Optional[List[tuple]] = None
        #: every report of the agent as (time, node, the report's dict) when a list (``--export-history``: what
        #: Prometheus keeps of the agent's series); None keeps nothing
        self.report_log: Optional[List[tuple]] = None

    def _event(self, name: str, state: str, reason: str, user: str, now: float) -> None:
        """A node went out of service, or its reason changed while out: the open event ends, a new one begins."""
        if self.events is None:
            return
        ev = self._open.get(name)
        if ev is not None:
            if ev[3] == state and ev[4] == reason:
                return
            ev[2] = now
        ev = [name, now, None, state, reason, user]
        self.events.append(ev)
        self._open[name] = ev

    def _event_end(self, name: str, now: float) -> None:
        ev = self._open.pop(name, None)
        if ev is not None:
            ev[2] = now

    def add(self, record: NodeState) -> NodeState:
        self.records[record.name] = record
        return record

    # ---- what a body asks for (the Slurm adapter's client interface) -------------------------------------------
    def drain(self, names: Iterable[str], reason: str) -> None:
        """``scontrol update State=DRAIN Reason=...`` as root: the node keeps its jobs (allocated) until they end."""
        now = self.clock()
        for name in names:
            sl = self.records[name]
            sl.flags, sl.reason, sl.reason_user, sl.reason_time = DRAIN, reason, "root", now
            self._event(name, "DRAIN", reason, "root", now)

    def resume(self, names: Iterable[str]) -> None:
        """``scontrol update State=RESUME``: back in service, no reason (22.05 clears it; the policy ignores 24.11's
        leftover on a node in service, so the simulator keeps none)."""
        now = None
        for name in names:
            sl = self.records[name]
            if sl.state == "down":
                sl.state = "idle"
            sl.flags, sl.reason, sl.reason_user, sl.reason_time = NO_FLAGS, "", "", None
            if name in self._open:
                now = self.clock() if now is None else now
                self._event_end(name, now)

    # ---- Slurm's own events ---------------------------------------------------------------------------------------
    def job_started(self, sl: NodeState) -> None:
        """A job runs on the node."""
        sl.state = "allocated"

    def job_left(self, sl: NodeState) -> None:
        """The node's job ended or was taken off it: the node shows no job."""
        if sl.state == "allocated":
            sl.state = "idle"
        if sl.jobs:
            sl.jobs = ()

    def not_responding(self, sl: NodeState) -> None:
        """slurmctld marks a node whose slurmd stopped answering DOWN, with its own reason."""
        now = self.clock()
        sl.state, sl.flags, sl.reason, sl.reason_user, sl.reason_time = "down", NO_FLAGS, NOT_RESPONDING, "slurm", now
        self._event(sl.name, "DOWN", NOT_RESPONDING, "slurm", now)

    def report(self, sl: NodeState, report: Optional[dict], at: float) -> None:
        """The agent's latest report on the node (what the repair run reads beside Slurm's record)."""
        sl.report, sl.report_time = report, at
        if self.report_log is not None and report is not None:
            self.report_log.append((at, sl.name, report))

    def jobs(self, sl: NodeState, jobs) -> None:
        """The jobs Slurm shows on the node or named by its eviction (``()`` none; None: not read)."""
        sl.jobs = jobs

    def booted(self, sl: NodeState, at: float) -> None:
        """The node rebooted: Slurm's boot time for it (the proof a reboot step ran)."""
        sl.boot_time = at

    def history(self, sl: NodeState, history) -> None:
        """A body wrote the node's repair history back to its Slurm field (``Extra``), as ``repair_step`` does."""
        sl.history = history
        if self.history_log is not None:
            self.history_log.append((self.clock(), sl.name, "" if history is None else dumps(history)))
