# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Slurm client: ``scontrol`` / ``sinfo`` / ``squeue``, or pyslurm for node reads and state changes.

Nodes are read as JSON where the release has it - 22.05 ``sinfo --json``, >= 23.02 ``scontrol show node --json`` -
and as ``scontrol -o -d show node`` text otherwise. A change is one ``scontrol update NodeName=<hostlist>`` (or one
pyslurm update) for all nodes, after checking that every named node exists, so that an unknown name never leaves a
partial update (``scontrol update NodeName=node1,node9 ...`` drains node1 and then fails on node9). Reboots, jobs,
requeue and hostlist expansion always go through the CLI.
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..slurmfacts import JOB_ACTIVE_STATES, is_job_id
from . import pyslurm_backend
from .errors import UNKNOWN_NODE, UNREACHABLE, SlurmError
from .hostlist import HostlistExpr, split_hostlist_expr, unique
from .node import NEXT_STATES, Node
from .parse import JOB_FIELDS, parse_job_records, parse_jobs_text, parse_nodes_json, parse_nodes_text, parse_version

#: A read of at most this many named nodes asks Slurm (23.02 and later) for those nodes only.
FEW_NODES = 64

#: argv -> (rc, stdout, stderr); modules pass a wrapper around ``module.run_command``.
Runner = Callable[[List[str]], Tuple[int, str, str]]


def subprocess_runner(env: Optional[Mapping[str, str]] = None, timeout: float = 120) -> Runner:
    """Default runner: argv -> (rc, stdout, stderr), LC_ALL=C, no shell."""
    def run(argv: List[str]) -> Tuple[int, str, str]:
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["LC_ALL"] = "C"
        try:
            # the default runner of non-module callers (the agent, the inventory plugin); modules pass run_command
            # pylint: disable-next=ansible-bad-function
            p = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=timeout, check=False)
        except FileNotFoundError as exc:
            return 127, "", f"{argv[0]}: command not found ({exc})"
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]} timed out after {timeout}s"
        return p.returncode, p.stdout, p.stderr
    return run


def _one_line(text: Optional[str], what: str) -> str:
    if "\n" in (text or ""):
        raise ValueError(f"{what} must be one line")
    return text or ""


class SlurmClient:
    """Read and change Slurm nodes.

    runner: callable argv -> (rc, stdout, stderr); modules pass a wrapper around ``module.run_command``.
    """

    def __init__(self, runner: Optional[Runner] = None, backend: str = "auto", scontrol: str = "scontrol",
                 sinfo: str = "sinfo", squeue: str = "squeue", env: Optional[Mapping[str, str]] = None,
                 scancel: str = "scancel") -> None:
        self.runner: Runner = runner or subprocess_runner(env)
        self.scontrol = scontrol
        self.sinfo = sinfo
        self.squeue = squeue
        self.scancel = scancel
        self.requested_backend = pyslurm_backend.check_backend(backend)
        self._version: Optional[Tuple[int, int, int]] = None
        self._backend: Optional[str] = None
        self.backend_reason = ""
        self._pyslurm: Optional[pyslurm_backend.PyslurmNodes] = None
        self.commands: List[List[str]] = []  # every argv run, for diagnostics and tests

    # ---- plumbing ----------------------------------------------------------------------------------------
    def _run(self, argv: Sequence[Any], unknown_ok: bool = False) -> str:
        args = [str(a) for a in argv]
        self.commands.append(args)
        rc, out, err = self.runner(args)
        out, err = out or "", err or ""
        if rc != 0:
            text = "; ".join(line.strip() for line in (err.strip() or out.strip()).splitlines()
                             if line.strip() and not line.startswith("**")) or f"rc={rc}"
            cmd = " ".join(args[:4])
            if rc == 127:
                raise SlurmError(f"{args[0]} not found: is the Slurm client installed and on PATH?", rc, out, err,
                                 kind="command")
            if UNREACHABLE.search(text):
                raise SlurmError(f"slurmctld unreachable ({cmd}): {text}", rc, out, err, kind="unreachable")
            if UNKNOWN_NODE.search(text) and not unknown_ok:
                raise SlurmError(f"unknown node ({cmd}): {text}", rc, out, err, kind="unknown_node")
            raise SlurmError(f"{cmd} failed (rc={rc}): {text}", rc, out, err, kind="command")
        return out

    def version_info(self) -> Tuple[int, int, int]:
        if self._version is None:
            self._version = parse_version(self._run([self.scontrol, "--version"]))
        return self._version

    def version(self) -> str:
        """Slurm version as 'major.minor.micro' (e.g. '22.05.8')."""
        major, minor, micro = self.version_info()
        return f"{major}.{minor:02d}.{micro}"

    @property
    def backend(self) -> str:
        if self._backend is None:
            if self.requested_backend == "cli":
                self._backend, self.backend_reason = "cli", "requested"
            else:
                mod = pyslurm_backend.import_pyslurm()
                self._backend, self.backend_reason = pyslurm_backend.select_backend(
                    self.requested_backend, mod, self.version_info() if mod is not None else None)
                if self._backend == "pyslurm":
                    self._pyslurm = pyslurm_backend.PyslurmNodes(mod)
        return self._backend

    def _py(self) -> Optional[pyslurm_backend.PyslurmNodes]:
        """The pyslurm client when that is the backend, else None (the CLI)."""
        return self._pyslurm if self.backend == "pyslurm" else None

    # ---- reading -----------------------------------------------------------------------------------------
    def expand_hostlist(self, expr: HostlistExpr) -> List[str]:
        """'node[1-3],gpu7' or a list -> ['node1', 'node2', 'node3', 'gpu7'] (via scontrol show hostnames)."""
        parts = split_hostlist_expr(expr)
        if all("[" not in p for p in parts):
            return unique(parts)
        out = self._run([self.scontrol, "show", "hostnames", ",".join(parts)])
        return unique(out.split())

    def compress_hostlist(self, names: Sequence[str]) -> str:
        names = list(names)
        if len(names) <= 1:
            return ",".join(names)
        return self._run([self.scontrol, "show", "hostlist", ",".join(names)]).strip()

    def nodes(self, names: Optional[HostlistExpr] = None) -> Dict[str, Node]:
        """{name: Node} for every node, or for ``names`` (a hostlist expression or list). Unknown -> error.

        Through the CLI on Slurm 23.02 and later, a read of up to ``FEW_NODES`` names asks slurmctld for those nodes
        only (``scontrol show node NAMES --json``); 22.05's ``sinfo --json`` ignores ``-n``, so there (and through
        pyslurm) the whole fleet is read and filtered here."""
        wanted = self.expand_hostlist(names) if names is not None else None
        py = self._py()
        if py is not None:
            allnodes = py.nodes()
        else:
            allnodes = self._cli_nodes(wanted if wanted is not None and len(wanted) <= FEW_NODES else None)
        if wanted is None:
            return allnodes
        missing = [n for n in wanted if n not in allnodes]
        if missing:
            raise SlurmError(f"unknown node(s): {', '.join(missing)}", kind="unknown_node")
        return {n: allnodes[n] for n in wanted}

    def _cli_nodes(self, few: Optional[List[str]] = None) -> Dict[str, Node]:
        major, minor, _micro = self.version_info()
        if (major, minor) >= (23, 2):
            argv = [self.scontrol, "show", "node", "--json"] + ([",".join(few)] if few else [])
        elif (major, minor) >= (21, 8):
            argv = [self.sinfo, "--json"]
        else:
            return parse_nodes_text(self._run([self.scontrol, "-o", "-d", "show", "node"]))
        out = self._run(argv)
        try:
            return parse_nodes_json(out)
        except SlurmError as exc:
            # sinfo --json exits 0 with {"errors": [{"error": "Unspecified error"}], "nodes": []} when
            # slurmctld is down: ask scontrol ping which it is.
            if exc.kind == "command":
                self.ping()
            raise

    def node(self, name: str) -> Node:
        if not isinstance(name, str) or not name or "," in name or "[" in name:
            raise ValueError(f"node(): one node name expected, got {name!r}")
        return self.nodes([name])[name]

    def jobs(self, node: Optional[str] = None, states: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
        """Jobs (optionally on one node / in some states) as dicts: job_id, state, user, nodes, elapsed,
        end_time (epoch or None), reason, name."""
        sep = "\x1f"
        fmt = sep.join(("%A", "%T", "%u", "%N", "%M", "%e", "%r", "%j"))
        argv = [self.squeue, "-h", "-o", fmt]
        if node:
            self.nodes(node)  # unknown node -> SlurmError(kind='unknown_node') instead of an empty list
            argv += ["-w", node]
        if states:
            argv += ["-t", ",".join(states)]
        return parse_jobs_text(self._run(argv), sep)

    def node_jobs(self, node: str, job_ids: Sequence[str] = ()) -> List[Dict[str, Any]]:
        """The jobs on ``node`` now, and the jobs ``job_ids`` wherever they are (an eviction under way follows
        them), as parse_job_records' dicts plus ``on_node`` (the job holds the node now). A node at a time: a job
        line that cannot be parsed (a comment with a newline) fails this node's read only. A job Slurm no longer
        knows is left out."""
        if not isinstance(node, str) or not node or "," in node or "[" in node:
            raise ValueError(f"node_jobs(): one node name expected, got {node!r}")
        bad = [j for j in job_ids if not is_job_id(j)]
        if bad:
            raise ValueError(f"node_jobs(): Slurm job ids expected, got {bad!r}")
        sep = "\x1f"
        fmt = ",".join(f"{f}:{sep}" for f in JOB_FIELDS)
        out: Dict[str, Dict[str, Any]] = {}
        for j in parse_job_records(self._run([self.squeue, "-h", "-w", node, "-O", fmt]), sep):
            out[j["job_id"]] = dict(j, on_node=j["state"] in JOB_ACTIVE_STATES)
        ids = [j for j in job_ids if j not in out]
        if ids:
            try:
                text = self._run([self.squeue, "-h", "-t", "all", "-j", ",".join(ids), "-O", fmt])
            except SlurmError as exc:
                if "Invalid job id" not in str(exc):
                    raise
                text = ""  # one id asked for, and Slurm has forgotten it (MinJobAge)
            for j in parse_job_records(text, sep):
                out.setdefault(j["job_id"], dict(j, on_node=False))
        return list(out.values())

    def signal_job(self, job_id: str, signal: str, to: str = "steps") -> None:
        """``scancel --signal=<signal> [--batch|--full] <job>``: ``to`` steps (the job steps' tasks, scancel's
        default), batch (the batch shell only) or full (both)."""
        if not is_job_id(job_id):
            raise ValueError(f"job_id must be a Slurm job id, got {job_id!r}")
        if not re.match(r"^[A-Z0-9]{1,8}$", str(signal)):
            raise ValueError(f"signal must be a signal name such as USR1, got {signal!r}")
        flag = {"steps": [], "batch": ["--batch"], "full": ["--full"]}.get(to)
        if flag is None:
            raise ValueError(f"to must be steps, batch or full, got {to!r}")
        self._run([self.scancel, f"--signal={signal}", *flag, job_id])

    # ---- changing ----------------------------------------------------------------------------------------
    def _targets(self, names: HostlistExpr) -> List[str]:
        """Expand and validate that every node exists (before anything changes): ``scontrol update`` and
        ``scontrol reboot`` apply a list with an unknown name to the known ones and fail. One plain name needs no
        read: Slurm refuses an unknown single node whole ("Invalid node name specified"), changing nothing."""
        parts = split_hostlist_expr(names)
        if len(parts) == 1 and "[" not in parts[0]:
            return parts
        return list(self.nodes(names))

    def _update(self, names: List[str], *settings: str) -> List[str]:
        hl = self.compress_hostlist(names)
        self._run([self.scontrol, "update", f"NodeName={hl}", *settings])
        return names

    def _set(self, targets: List[str], py_changes: Dict[str, Any], *settings: str) -> List[str]:
        """One update of ``targets``: through pyslurm when that is the backend, else one scontrol update."""
        py = self._py()
        if py is not None:
            py.modify(targets, **py_changes)
            return targets
        return self._update(targets, *settings)

    @staticmethod
    def _need_reason(reason: Optional[str], what: str) -> str:
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"a non-empty reason is required to {what} a node")
        if "\n" in reason:
            raise ValueError("reason must be one line")
        return reason.strip()

    def drain(self, names: HostlistExpr, reason: str) -> List[str]:
        reason = self._need_reason(reason, "drain")
        return self._set(self._targets(names), {"state": "DRAIN", "reason": reason}, "State=DRAIN",
                         f"Reason={reason}")

    def down(self, names: HostlistExpr, reason: str) -> List[str]:
        reason = self._need_reason(reason, "down")
        return self._set(self._targets(names), {"state": "DOWN", "reason": reason}, "State=DOWN", f"Reason={reason}")

    def resume(self, names: HostlistExpr) -> List[str]:
        """Resume nodes that are out of service (drained, draining, down, failed); others are left alone (scontrol
        would reject the whole batch with 'Invalid node state specified'). Returns the names resumed."""
        targets = [n for n, node in self.nodes(names).items() if node.out_of_service]
        if not targets:
            return []
        return self._set(targets, {"state": "RESUME"}, "State=RESUME")

    def reboot(self, names: HostlistExpr, reason: Optional[str] = None, nextstate: str = "resume",
               asap: bool = True) -> List[str]:
        """``scontrol reboot [ASAP] nextstate=... [reason=...] <hostlist>`` (reason optional, as in Slurm)."""
        if reason is not None:
            reason = self._need_reason(reason, "reboot")
        if nextstate not in NEXT_STATES:
            raise ValueError(f"nextstate must be one of {', '.join(NEXT_STATES)}; got {nextstate!r}")
        targets = self._targets(names)
        argv = [self.scontrol, "reboot"]
        if asap:
            argv.append("ASAP")
        argv.append(f"nextstate={nextstate.upper()}")
        if reason:
            argv.append(f"reason={reason}")
        argv.append(self.compress_hostlist(targets))
        self._run(argv)
        return targets

    def cancel_reboot(self, names: HostlistExpr) -> List[str]:
        targets = self._targets(names)
        self._run([self.scontrol, "cancel_reboot", self.compress_hostlist(targets)])
        return targets

    def set_comment(self, name: HostlistExpr, text: Optional[str]) -> List[str]:
        targets = self._targets(name)
        text = _one_line(text, "comment")
        return self._set(targets, {"comment": text}, f"Comment={text}")

    def set_extra(self, name: HostlistExpr, text: Optional[str]) -> List[str]:
        """Node Extra field (Slurm >= 22.05); older releases fall back to Comment."""
        targets = self._targets(name)
        text = _one_line(text, "extra")
        if self.version_info()[:2] < (22, 5):
            return self._update(targets, f"Comment={text}")
        return self._set(targets, {"extra": text}, f"Extra={text}")

    def update_node(self, name: str, *, history_field: Optional[str] = None, history: Optional[str] = None,
                    state: Optional[str] = None, reason: Optional[str] = None) -> List[str]:
        """One update of one node that sets its repair history (in ``history_field``) and/or its state
        (``DRAIN`` with ``reason``, or ``RESUME``) together: one ``scontrol update`` (one RPC through pyslurm), so
        the history and the state never part half way."""
        if not isinstance(name, str) or not name or "," in name or "[" in name:
            raise ValueError(f"update_node(): one node name expected, got {name!r}")
        py_changes: Dict[str, Any] = {}
        settings: List[str] = []
        if history is not None:
            if history_field not in ("extra", "comment"):
                raise ValueError(f"history_field must be extra or comment; got {history_field!r}")
            text = _one_line(history, history_field)
            key = "comment" if history_field == "comment" or self.version_info()[:2] < (22, 5) else "extra"
            py_changes[key] = text
            settings.append(f"{key.capitalize()}={text}")
        if state == "DRAIN":
            reason = self._need_reason(reason, "drain")
            py_changes.update(state="DRAIN", reason=reason)
            settings += ["State=DRAIN", f"Reason={reason}"]
        elif state == "RESUME":
            py_changes["state"] = "RESUME"
            settings.append("State=RESUME")
        elif state is not None:
            raise ValueError(f"state must be DRAIN or RESUME; got {state!r}")
        if not settings:
            return []
        return self._set([name], py_changes, *settings)

    def set_history(self, name: str, field: str, text: Optional[str]) -> List[str]:
        """Store the repair history in the node's ``field`` (``extra`` or ``comment``)."""
        if field == "extra":
            return self.set_extra(name, text)
        if field == "comment":
            return self.set_comment(name, text)
        raise ValueError(f"history_field must be extra or comment; got {field!r}")

    def requeue(self, job_id: Any) -> str:
        text = str(job_id).strip()
        if not is_job_id(text):
            raise ValueError(f"job_id must be a Slurm job id, got {text!r}")
        self._run([self.scontrol, "requeue", text])
        return text

    def start_now(self, job_id: Any) -> None:
        """``scontrol update JobId=<job> StartTime=now``: lift the begin time Slurm gives a requeued job (about two
        minutes after the requeue), so it starts as soon as nodes are free. Only a pending job takes it."""
        text = str(job_id).strip()
        if not is_job_id(text):
            raise ValueError(f"job_id must be a Slurm job id, got {text!r}")
        self._run([self.scontrol, "update", f"JobId={text}", "StartTime=now"])

    def ping(self) -> bool:
        """True when slurmctld answers; raises SlurmError(kind='unreachable') otherwise."""
        out = self._run([self.scontrol, "ping"])
        if "is UP" not in out:
            raise SlurmError(f"slurmctld is not up: {out.strip()}", 1, out, "", kind="unreachable")
        return True
