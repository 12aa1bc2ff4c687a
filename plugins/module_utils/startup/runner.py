# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node startup runner: run a node's startup scripts in order and keep Slurm away until they pass.

The command line ``gpufleet-startup`` (``run``, ``gate``) is the body ``cli/startup.py``; this module is the
runner it drives (``Runner``) and the gate's decision (``gate``).

Each script runs in its own session (so its own process group) with stdin from /dev/null and stdout+stderr in
STATE_DIR/output/NAME.log. At its timeout the whole group gets SIGTERM, then SIGKILL after --kill-grace seconds.
A failing script is retried ``retries`` times; the first non-optional script that still fails stops the run.
``once`` scripts are marked done in STATE_DIR/once/ and never run again; ``boot`` scripts run once per boot id;
``every_boot`` scripts run on every invocation. With --node/--slurm a failure drains the node with the reason
``gpufleet: startup <script>``; success resumes it only if the drain reason starts with ``gpufleet: startup``.

Exit status: 0 all passed; 1 a script, the health check or the metadata failed; 2 bad usage; 3 Slurm could not be
updated (or another run holds the lock). Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from ..fileutil import atomic_write
from ..slurmfacts import STARTUP_REASON, drain_reason, startup_action
from .scripts import ScriptMeta, discover, unmanaged

REASON_PREFIX = STARTUP_REASON
HEALTH_STEP = "health-check"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
LAST_RUN = "last-run.json"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SLURM = 0, 1, 2, 3


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return "unknown"


class Log:
    """Log lines to a file, to the systemd journal when its socket exists, else to stderr."""

    def __init__(self, path: Optional[str], journal: str = "auto", journal_socket: str = JOURNAL_SOCKET,
                 quiet: bool = False) -> None:
        self.path = path
        self.journal_socket = journal_socket
        self.sock: Optional[socket.socket] = None
        self.quiet = quiet
        self.errors: List[str] = []
        if journal in ("auto", "on") and os.path.exists(journal_socket):
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            except OSError as exc:
                self.errors.append(f"journal: {exc}")
        elif journal == "on":
            self.errors.append(f"journal: socket {journal_socket} does not exist")
        if path:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            except OSError as exc:
                self.errors.append(f"log file {path}: {exc}")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    @staticmethod
    def journal_datagram(message: str, priority: int, fields: Dict[str, Any]) -> bytes:
        """One entry in the journal's native protocol (binary-safe form for every field)."""
        items = [("MESSAGE", message), ("PRIORITY", str(priority)), ("SYSLOG_IDENTIFIER", "gpufleet-startup")]
        items += [("GPUFLEET_" + k.upper(), "" if v is None else str(v)) for k, v in sorted(fields.items())]
        out = b""
        for key, value in items:
            data = value.encode("utf-8", "replace")
            out += key.encode("ascii") + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        return out

    def emit(self, message: str, priority: int = 6, tail: Optional[List[str]] = None, **fields: Any) -> None:
        text = message
        if tail:
            text += "\n" + "\n".join("  | " + line for line in tail)
        line = f"{_now()} gpufleet-startup[{os.getpid()}]: {text}\n"
        if self.path:
            try:
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(line)
            except OSError as exc:
                self.errors.append(f"log file {self.path}: {exc}")
        if self.sock is not None:
            try:
                self.sock.sendto(self.journal_datagram(text, priority, fields), self.journal_socket)
            except OSError as exc:
                self.errors.append(f"journal: {exc}")
        elif not self.quiet:
            sys.stderr.write(line)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Only zombies left (their parent has not reaped them yet) count as gone.
    return any(_pgid_of_live(pid) == pgid for pid in _pids())


def _pids() -> List[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _pgid_of_live(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[2])


def kill_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL what is left after ``grace`` seconds, reap ``proc``."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(pgid):
            break
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + 5.0
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


def tail_of(path: str, lines: int) -> List[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            data = handle.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").rstrip("\n")
    return text.split("\n")[-lines:] if text else []


def run_command(argv: List[str], env: Dict[str, str], cwd: str, timeout: float, out_path: str,
                grace: float) -> Dict[str, Any]:
    """Run once: {'exit_code', 'timed_out', 'error'}; the group is killed at the timeout."""
    with open(out_path, "wb") as out:
        try:
            # a boot script runs in a session of its own so that its whole process group can be killed at the timeout
            # pylint: disable-next=ansible-bad-function
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=cwd, env=env, start_new_session=True, close_fds=True)
        except OSError as exc:
            out.write((f"gpufleet-startup: cannot execute {argv[0]}: {exc}\n").encode())
            return {"exit_code": None, "timed_out": False, "error": f"cannot execute: {exc}"}
        try:
            code = proc.wait(timeout=timeout)
            return {"exit_code": code, "timed_out": False, "error": None}
        except subprocess.TimeoutExpired:
            kill_group(proc, grace)
            return {"exit_code": proc.returncode, "timed_out": True,
                    "error": f"timed out after {timeout}s; process group {proc.pid} killed"}
        except BaseException:
            kill_group(proc, grace)
            raise


class Runner:
    def __init__(self, args: argparse.Namespace, log: Log) -> None:
        self.args = args
        self.log = log
        self.state_dir = os.path.abspath(args.state_dir)
        self.scripts_dir = os.path.abspath(args.scripts_dir)
        self.boot_id = args.boot_id or read_boot_id()
        self.output_dir = os.path.join(self.state_dir, "output")

    # -- state ------------------------------------------------------------------------------------------------
    def _marker(self, meta: ScriptMeta) -> Optional[str]:
        if meta.phase == "once":
            return os.path.join(self.state_dir, "once", meta.name)
        if meta.phase == "boot":
            return os.path.join(self.state_dir, "boot", self.boot_id, meta.name)
        return None

    def _mark_done(self, meta: ScriptMeta, result: Dict[str, Any]) -> None:
        marker = self._marker(meta)
        if marker is None:
            return
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        record = {"name": meta.name, "phase": meta.phase, "boot_id": self.boot_id, "ended": result["ended"],
                  "attempts": result["attempts"]}
        atomic_write(marker, (json.dumps(record, sort_keys=True) + "\n").encode(), 0o644)

    def _prune_boot_markers(self) -> None:
        base = os.path.join(self.state_dir, "boot")
        try:
            entries = os.listdir(base)
        except OSError:
            return
        for entry in entries:
            if entry == self.boot_id:
                continue
            path = os.path.join(base, entry)
            try:
                for name in os.listdir(path):
                    os.unlink(os.path.join(path, name))
                os.rmdir(path)
            except OSError as exc:
                self.log.emit(f"cannot prune old boot markers {path}: {exc}", priority=4, event="warning")

    # -- steps ------------------------------------------------------------------------------------------------
    def _env(self, extra: Dict[str, str], name: str, attempt: int) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(extra)
        env.update({
            "GPUFLEET_STARTUP_SCRIPT": name,
            "GPUFLEET_STARTUP_ATTEMPT": str(attempt),
            "GPUFLEET_STARTUP_PHASE": self.args.phase or "all",
            "GPUFLEET_STARTUP_STATE_DIR": self.state_dir,
            "GPUFLEET_BOOT_ID": self.boot_id,
        })
        if self.args.role:
            env["GPUFLEET_NODE_ROLE"] = self.args.role
        if self.args.node:
            env["GPUFLEET_NODE_NAME"] = self.args.node
        return env

    def _step(self, name: str, argv: List[str], timeout: int, retries: int, retry_delay: int,
              env: Dict[str, str], info: Dict[str, Any]) -> Dict[str, Any]:
        out_path = os.path.join(self.output_dir, name + ".log")
        result: Dict[str, Any] = dict(info, name=name, status="failed", attempts=0, exit_code=None,
                                      timed_out=False, error=None, output=out_path, started=_now())
        start = time.monotonic()
        for attempt in range(1, retries + 2):
            result["attempts"] = attempt
            self.log.emit(f"{name}: start (attempt {attempt}/{retries + 1}, timeout {timeout}s)",
                          script=name, event="start", attempt=attempt)
            one = run_command(argv, self._env(env, name, attempt), self.scripts_dir, timeout, out_path,
                              self.args.kill_grace)
            result.update(one)
            tail = tail_of(out_path, self.args.tail_lines)
            result["output_tail"] = tail
            ok = one["exit_code"] == 0 and not one["timed_out"]
            what = "exit {}".format(one["exit_code"]) if one["error"] is None else one["error"]
            self.log.emit(f"{name}: end, {what} (attempt {attempt}/{retries + 1})",
                          priority=6 if ok else 3, tail=tail, script=name, event="end", attempt=attempt,
                          exit_code=one["exit_code"], timed_out=one["timed_out"])
            if ok:
                result["status"] = "ok"
                break
            if attempt <= retries and retry_delay:
                time.sleep(retry_delay)
        result["ended"] = _now()
        result["duration_s"] = round(time.monotonic() - start, 3)
        return result

    # -- slurm ------------------------------------------------------------------------------------------------
    def _slurm(self, failed: Optional[str]) -> Dict[str, Any]:
        node = self.args.node
        out: Dict[str, Any] = {"node": node, "action": "none", "reason": None, "error": None}
        try:
            from ..slurm import SlurmClient, SlurmError
        except ImportError as exc:
            out["error"] = f"Slurm adapter not importable: {exc}"
            return out
        try:
            client = SlurmClient()
            state = client.node(node)
            flags = frozenset(getattr(state, "flags", ()) or ())
            reason = getattr(state, "reason", None) or ""
            out["before"] = {"flags": sorted(flags), "reason": reason}
            want = None if failed is None else drain_reason(failed, prefix=REASON_PREFIX)
            action, why = startup_action(getattr(state, "state", ""), flags, reason, want)
            out["reason"] = why
            if action == "drain" and why is not None:
                client.drain([node], why)
            elif action == "resume":
                client.resume([node])
            out["action"] = action
        except SlurmError as exc:
            out["error"] = str(exc)
        except (OSError, ValueError) as exc:
            out["error"] = f"cannot update Slurm node {node!r}: {exc}"
        return out

    # -- run --------------------------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        args = self.args
        report: Dict[str, Any] = {
            "version": 1, "started": _now(), "scripts_dir": self.scripts_dir, "state_dir": self.state_dir,
            "runner": os.path.abspath(__file__),
            "phase": args.phase or "all", "role": args.role, "node": args.node, "boot_id": self.boot_id,
            "scripts": [], "errors": [], "health": None, "slurm": None, "failed": None,
        }
        self.log.emit(f"run start: scripts {self.scripts_dir}, phase {args.phase or 'all'}, "
                      f"role {args.role or 'any'}, node {args.node or '-'}", event="run-start")
        metas, errors = discover(self.scripts_dir)
        report["errors"] = errors
        failed: Optional[str] = None
        for err in errors:
            self.log.emit(f"metadata error: {err}", priority=3, event="error")
        if errors:
            failed = "metadata"
        report["unmanaged"] = unmanaged(self.scripts_dir)
        for name in report["unmanaged"]:
            self.log.emit(f"{name!r}: no metadata file ({name!r} + '.json'), not run; install scripts with the "
                          "startup_scripts role or the startup_script module", priority=4, event="unmanaged",
                          script=name)
        self._prune_boot_markers()
        stopped = failed is not None
        for meta in metas:
            info = {"phase": meta.phase, "order": meta.order, "optional": meta.optional}
            if args.phase and meta.phase != args.phase:
                continue
            if args.role and args.role not in meta.roles:
                report["scripts"].append(dict(info, name=meta.name, status="skipped",
                                              skip_reason=f"not for role {args.role}"))
                continue
            if stopped:
                report["scripts"].append(dict(info, name=meta.name, status="not_run",
                                              skip_reason="an earlier step failed"))
                continue
            marker = self._marker(meta)
            if marker and os.path.exists(marker):
                report["scripts"].append(dict(info, name=meta.name, status="skipped",
                                              skip_reason="already done" + (" this boot" if meta.phase == "boot"
                                                                            else "")))
                self.log.emit(f"{meta.name}: skipped, {meta.phase} already done", script=meta.name,
                              event="skip")
                continue
            result = self._step(meta.name, [os.path.join(self.scripts_dir, meta.name)], meta.timeout,
                                meta.retries, meta.retry_delay, meta.environment, info)
            report["scripts"].append(result)
            if result["status"] == "ok":
                self._mark_done(meta, result)
            elif not meta.optional:
                failed = meta.name
                stopped = True
        if failed is None and args.health_cmd:
            try:
                argv = shlex.split(args.health_cmd)
            except ValueError as exc:
                argv = []
                report["errors"].append(f"--health-cmd: {exc}")
            if argv:
                report["health"] = self._step(HEALTH_STEP, argv, args.health_timeout, 0, 0, {}, {"phase": None})
                if report["health"]["status"] != "ok":
                    failed = HEALTH_STEP
            else:
                failed = HEALTH_STEP
        report["failed"] = failed
        report["ok"] = failed is None
        if args.node:
            report["slurm"] = self._slurm(failed)
            sl = report["slurm"]
            self.log.emit("slurm {}: {}{}{}".format(args.node, sl["action"],
                                                    " ({})".format(sl["reason"]) if sl["reason"] else "",
                                                    ", error: {}".format(sl["error"]) if sl["error"] else ""),
                          priority=3 if sl["error"] else 6, event="slurm", action=sl["action"])
        report["ended"] = _now()
        count = len(report["unmanaged"])
        outcome = "ok" if failed is None else f"FAILED at {failed}"
        self.log.emit(f"run end: {outcome}" + (f", {count} file(s) without metadata not run" if count else ""),
                      priority=6 if failed is None else 3, event="run-end", failed=failed)
        return report


def gate(state_dir: str, boot_id: str) -> Tuple[int, str]:
    """Decide whether slurmd may start (its ExecStartPre): (exit status, message).

    slurmd may start when this boot's run passed, or when it failed and the node was drained (or was already
    drained by someone else), so that the node registers but takes no jobs. It may not start when there is no
    report for this boot or when a failed run could not drain the node.
    """
    path = os.path.join(state_dir, LAST_RUN)
    try:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
    except (OSError, ValueError) as exc:
        return EXIT_FAILED, f"no usable startup report {path}: {exc}; slurmd must not start"
    if report.get("boot_id") != boot_id:
        return EXIT_FAILED, (f"startup report {path} is from boot {report.get('boot_id')}, not this boot "
                             f"{boot_id}; slurmd must not start")
    if report.get("ok"):
        return EXIT_OK, "startup passed this boot"
    slurm = report.get("slurm") or {}
    if slurm.get("action") in ("drain", "kept") and not slurm.get("error"):
        return EXIT_OK, (f"startup failed at {report.get('failed')}; node {slurm.get('node')} is drained "
                         f"({slurm.get('reason')}), slurmd may start")
    return EXIT_FAILED, (f"startup failed at {report.get('failed')} and the node could not be drained "
                         f"({slurm.get('error') or 'no Slurm node configured'}); slurmd must not start")
