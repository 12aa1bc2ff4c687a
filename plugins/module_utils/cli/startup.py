# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``gpufleet-startup``: the command line of the node startup runner (the runner itself is ``startup.runner``).

    gpufleet-startup run --scripts-dir DIR --state-dir DIR [--phase PHASE] [--json PATH|-]
                         [--role worker|login|controller] [--node NAME | --slurm]
                         [--health-cmd CMD] [--log-file PATH] [--journal auto|on|off]
    gpufleet-startup gate --state-dir DIR      (slurmd's ExecStartPre: may slurmd start?)

A body: it parses the options, holds the state directory's lock, runs ``startup.runner.Runner`` and writes its
report; ``gate`` prints the decision of ``startup.runner.gate``.

Exit status: 0 all passed; 1 a script, the health check or the metadata failed; 2 bad usage; 3 Slurm could not be
updated (or another run holds the lock). Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import sys
from typing import List, Optional

from ..fileutil import atomic_write
from ..startup.runner import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SLURM,
    EXIT_USAGE,
    JOURNAL_SOCKET,
    LAST_RUN,
    Log,
    Runner,
    gate,
    read_boot_id,
)
from ..startup.scripts import NODE_ROLES, PHASES, MetaError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet-startup", description="Run node startup scripts in order.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the scripts of a phase (all phases by default)")
    run.add_argument("--scripts-dir", required=True, help="directory of NAME + NAME.json pairs")
    run.add_argument("--state-dir", required=True, help="persistent state: once/boot markers, output, log")
    run.add_argument("--phase", choices=PHASES, help="run only scripts of this phase")
    run.add_argument("--role", choices=NODE_ROLES, help="this node's role; scripts for other roles are skipped")
    run.add_argument("--json", metavar="PATH|-", help="write the JSON report to PATH (atomically) or stdout")
    run.add_argument("--log-file", help="append log lines here (default STATE_DIR/startup.log; '' for none)")
    run.add_argument("--journal", choices=("auto", "on", "off"), default="auto",
                     help="log to the systemd journal (auto: when its socket exists)")
    run.add_argument("--journal-socket", default=JOURNAL_SOCKET, help=argparse.SUPPRESS)
    run.add_argument("--node", help="Slurm node name to drain on failure / resume on success")
    run.add_argument("--slurm", action="store_true",
                     help="act on Slurm for $SLURMD_NODENAME (or the short host name) when --node is not given")
    run.add_argument("--health-cmd", help="command run after the scripts; non-zero keeps the node drained")
    run.add_argument("--health-timeout", type=int, default=600, help="seconds (default 600)")
    run.add_argument("--kill-grace", type=float, default=5.0,
                     help="seconds between SIGTERM and SIGKILL of a timed-out script's group (default 5)")
    run.add_argument("--tail-lines", type=int, default=40, help="lines of output kept in log and JSON (default 40)")
    run.add_argument("--boot-id", help=argparse.SUPPRESS)
    run.add_argument("--quiet", action="store_true", help="no log lines on stderr")
    gate_p = sub.add_parser("gate", help="exit 0 when slurmd may start (this boot's run passed, or failed and "
                                         "the node is drained); for slurmd's ExecStartPre")
    gate_p.add_argument("--state-dir", required=True)
    gate_p.add_argument("--boot-id", help=argparse.SUPPRESS)
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    if args.slurm and not args.node:
        args.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if args.tail_lines < 1 or args.health_timeout < 1 or args.kill_grace < 0:
        sys.stderr.write("gpufleet-startup: --tail-lines and --health-timeout must be >= 1, --kill-grace >= 0\n")
        return EXIT_USAGE
    if not os.path.isdir(args.scripts_dir):
        sys.stderr.write(f"gpufleet-startup: --scripts-dir {args.scripts_dir}: not a directory\n")
        return EXIT_USAGE
    state_dir = os.path.abspath(args.state_dir)
    try:
        os.makedirs(os.path.join(state_dir, "output"), exist_ok=True)
        lock = open(os.path.join(state_dir, ".lock"), "a")  # noqa: SIM115 - held for the whole run
    except OSError as exc:
        sys.stderr.write(f"gpufleet-startup: --state-dir {state_dir}: {exc}\n")
        return EXIT_USAGE
    try:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            sys.stderr.write(f"gpufleet-startup: another run holds {state_dir}/.lock\n")
            return EXIT_SLURM
        log_file = os.path.join(state_dir, "startup.log") if args.log_file is None else (args.log_file or None)
        log = Log(log_file, args.journal, args.journal_socket, quiet=args.quiet or args.json == "-")
        try:
            report = Runner(args, log).run()
        except MetaError as exc:
            sys.stderr.write(f"gpufleet-startup: {exc}\n")
            return EXIT_USAGE
        finally:
            log.close()
        report["log_errors"] = log.errors
        text = json.dumps(report, indent=2, sort_keys=True) + "\n"
        atomic_write(os.path.join(state_dir, LAST_RUN), text.encode("utf-8"), 0o644)
        if args.json == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        elif args.json:
            atomic_write(os.path.abspath(args.json), text.encode("utf-8"), 0o644)
        if not report["ok"]:
            return EXIT_FAILED
        if report["slurm"] and report["slurm"]["error"]:
            return EXIT_SLURM
        return EXIT_OK
    finally:
        lock.close()


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "gate":
        code, message = gate(os.path.abspath(args.state_dir), args.boot_id or read_boot_id())
        sys.stderr.write(f"gpufleet-startup gate: {message}\n")
        return code
    return _cmd_run(args)


if __name__ == "__main__":  # pragma: no cover - python -m ...cli.startup
    raise SystemExit(main())
