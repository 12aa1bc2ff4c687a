# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node agent ``gpufleet-health``: probe, judge, report, and (with --slurm) drain its own node.

Runs from the console script in ``.venv`` for development, and on nodes from the copy the gpu_health role puts
in /opt/gpufleet/lib (``python3 -m ansible_collections.gpufleet.reliability.plugins.module_utils.cli.health_agent``),
as Slurm's HealthCheckProgram and from a systemd timer. A body: the rules are the health brain's (``health``)
and the drain rule the repair brain's (``repair.drain``, ``repair.owner``). The exit code follows the verdict:
0 healthy, 1 degraded, 2 unhealthy, 3 unknown; 64 for bad usage or input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, MutableMapping, Optional, Tuple

from .. import safeyaml
from ..health import judge, metrics
from ..health.model import PROBE_FAILED, Snapshot
from ..health.report import Report
from ..health.smi import read_nvidia_smi_text, read_nvidia_smi_xml
from ..health.xid_catalog_data import CATALOG_VERSION
from ..statefile import atomic_write, load_state, save_state

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
EXIT_USAGE = 64
PROM_FILE = metrics.PROM_FILE


class UsageError(Exception):
    pass


def _fix_environment(env: Optional[MutableMapping[str, str]] = None) -> None:
    """HealthCheckProgram and systemd start us with (almost) no environment: give PATH and SLURM_CONF defaults."""
    if env is None:
        env = os.environ
    path = env.get("PATH", "")
    parts = [p for p in path.split(":") if p]
    for p in DEFAULT_PATH.split(":"):
        if p not in parts:
            parts.append(p)
    env["PATH"] = ":".join(parts)
    if not env.get("SLURM_CONF") and os.path.exists(DEFAULT_SLURM_CONF):
        env["SLURM_CONF"] = DEFAULT_SLURM_CONF


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufleet-health", description="Passive GPU node health check.")
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("check", help="probe the GPUs and the kernel log, print the verdict")
    src = c.add_mutually_exclusive_group()
    src.add_argument("--nvidia-smi-xml", metavar="FILE", help="replay an `nvidia-smi -q -x` capture")
    src.add_argument("--nvidia-smi-text", metavar="FILE", help="replay an `nvidia-smi -q` capture")
    src.add_argument("--snapshot-json", metavar="FILE", help="replay a snapshot written by --record")
    src.add_argument("--fake-nvml", metavar="FILE", help="probe a fake NVML configured from JSON/YAML")
    c.add_argument("--kmsg", metavar="FILE", help="captured kernel log instead of /dev/kmsg ('-' = none)")
    c.add_argument("--as-of", choices=("now", "latest"), help="judge kernel events as of now, or as of the newest "
                   "dated line (default: latest for --kmsg FILE, now for /dev/kmsg)")
    c.add_argument("--expected-gpus", type=int, metavar="N")
    c.add_argument("--config", metavar="FILE", help="rules config (JSON, or YAML when PyYAML is there)")
    c.add_argument("--state-file", metavar="FILE", help="state carried between runs (rates, sticky events)")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--report-file", metavar="FILE", help="also write the JSON report there (atomically)")
    c.add_argument("--slurm", action="store_true", help="drain this node when unhealthy or when a finding asks "
                   "for a drain (never resumes)")
    c.add_argument("--repair-config", metavar="FILE", help="with --slurm: drain through the repair policy's limits "
                   "(blast_radius, breaker) read from FILE (JSON, or YAML), or its defaults with 'default'; a node "
                   "that cannot run jobs is drained at once. Without it, --slurm drains whenever the report asks")
    c.add_argument("--node", metavar="NAME", help="Slurm node name (default: $SLURMD_NODENAME or the hostname)")
    c.add_argument("--textfile", metavar="DIR", help="write Prometheus metrics for node_exporter's textfile dir")
    c.add_argument("--record", metavar="DIR", help="also save the snapshot and kernel log as a fixture")
    c.add_argument("--deadline", type=float, default=20.0, metavar="S", help="NVML probe deadline (default 20)")
    c.add_argument("--repaired-at", type=float, metavar="EPOCH",
                   help="this check verifies a repair step (GPU reset, reboot) that started then: kernel events up "
                        "to that time are what it fixed; forgotten now and in later runs (kept in --state-file)")
    c.add_argument("--now", type=float, metavar="EPOCH", help=argparse.SUPPRESS)
    return p


def _read(path: str, what: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc.strerror}")


def _load_mapping(path: str, what: str) -> Dict[str, Any]:
    text = _read(path, what)
    if path.endswith((".yml", ".yaml")):
        try:
            data = safeyaml.load(text, f"{what} {path}")  # no hang or crash on deep nesting
        except ValueError as exc:
            raise UsageError(str(exc))
    else:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            raise UsageError(f"{what} {path}: not valid JSON: {str(exc)[:200]}")
    if not isinstance(data, dict):
        raise UsageError(f"{what} {path}: expected a mapping at the top level")
    return data


def _snapshot(args: argparse.Namespace) -> Snapshot:
    if args.nvidia_smi_xml:
        return read_nvidia_smi_xml(_read(args.nvidia_smi_xml, "--nvidia-smi-xml"))
    if args.nvidia_smi_text:
        return read_nvidia_smi_text(_read(args.nvidia_smi_text, "--nvidia-smi-text"))
    if args.snapshot_json:
        data = _load_mapping(args.snapshot_json, "--snapshot-json")
        data = data.get("snapshot", data)
        try:
            return Snapshot.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--snapshot-json {args.snapshot_json}: {exc}")
    from .. import nvml  # the live path: pynvml in a child with a deadline (imported only when needed)
    marker = (args.state_file + ".probe-pid") if args.state_file else None
    try:
        snap = nvml.probe_with_deadline(args.deadline, fake_nvml=args.fake_nvml, marker_path=marker)
    except (OSError, ValueError) as exc:
        if args.fake_nvml:
            raise UsageError(f"--fake-nvml {args.fake_nvml}: {exc}")
        snap = Snapshot(source="nvml", probe_status=PROBE_FAILED, probe_error=str(exc))
    if not args.fake_nvml:  # this machine's IB ports, mounts, disks, memory (not for stand-ins and replays)
        from .. import nodeinfo
        nodeinfo.fill(snap)
    return snap


def _kernel_lines(args: argparse.Namespace, state: Dict[str, Any],
                  notes: List[str]) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """(kernel-log text or events, new kmsg cursor or None)."""
    if args.kmsg == "-":
        return [], None
    if args.kmsg:
        return _read(args.kmsg, "--kmsg"), None
    from .. import kmsg
    try:
        events, cursor = kmsg.live_events(state.get("kmsg_cursor"))
        return events, cursor
    except OSError as exc:
        notes.append(f"kernel log not read: /dev/kmsg: {exc.strerror or exc}")
        return [], None


def _hostname() -> str:
    return os.uname().nodename.split(".")[0]


def node_name(args: Optional[argparse.Namespace] = None) -> str:
    if args is not None and getattr(args, "node", None):
        return args.node
    return os.environ.get("SLURMD_NODENAME") or _hostname()


def slurm_act(report: Report, name: str, client: Any = None, limits: Any = None,
              clock: Callable[[], float] = time.time) -> Dict[str, Any]:
    """Carry out the drain rule (``repair.drain.drain_decision``) for our own node: read Slurm, decide, drain when
    the decision says so; never resume.

    ``limits`` is the repair policy's RepairConfig or its mapping (None = no limits: a report that asks for a
    drain drains, under the ownership rule). With limits, a node that cannot run jobs drains at once (read with the
    whole fleet, so the result says how it stands against the limits and the breaker); a warning is not drained
    here (action ``defer``): the repair run decides it, one writer with the whole fleet in view."""
    result: Dict[str, Any] = {"node": name, "action": "none", "reason": None}
    if not (report.verdict == "unhealthy" or report.drain):
        return result
    result["reason"] = report.drain_reason()[:200]
    try:
        from ..repair import RepairConfig, RepairError
        from ..repair.drain import cannot_run_jobs, drain_decision
        from ..slurm import SlurmClient, SlurmError
        from ..slurm.repair_inputs import drain_inputs
    except ImportError as exc:  # pragma: no cover - the role always ships slurm.py and repair/
        result.update(action="error", detail=f"Slurm adapter or repair policy missing: {exc}")
        return result
    try:
        client = client or SlurmClient(backend="cli")
        if limits is not None and not isinstance(limits, RepairConfig):
            limits = RepairConfig.from_dict(limits)  # the config file's mapping
        whole = limits is not None and cannot_run_jobs(report)
        inputs = drain_inputs(client.nodes().values() if whole else [client.node(name)], name)
        decision = drain_decision(report, inputs.me, inputs.fleet, inputs.before, limits, clock())
        result.update(forced=decision.forced, rule=decision.rule, detail=decision.detail)
        if decision.breaker:
            result["breaker"] = decision.breaker
        if decision.check_at is not None:
            result["check_at"] = decision.check_at
        if decision.action == "drain":
            client.drain([name], decision.reason)
            result["action"] = "drained"
        else:
            result["action"] = decision.action
    except (SlurmError, RepairError, ValueError) as exc:
        result.update(action="error", detail=str(exc))
    return result


def _load_limits(path: Optional[str]) -> Any:
    """--repair-config: None (no limits), the policy defaults ('default'), or the repair policy config file."""
    if path is None:
        return None
    from ..repair import RepairConfig, RepairError
    data = {} if path == "default" else _load_mapping(path, "--repair-config")
    try:
        return RepairConfig.from_dict(data)
    except RepairError as exc:
        raise UsageError(f"--repair-config {path}: {exc}")


def _shout(message: str) -> None:
    """A tripped breaker: stderr (slurmd's or the timer's log) and syslog, besides the report."""
    sys.stderr.write(f"gpufleet-health: {message}\n")
    try:
        import syslog
        syslog.syslog(syslog.LOG_WARNING, f"gpufleet-health: {message}")
    except (ImportError, OSError):  # pragma: no cover - no syslog on this platform
        pass


# ------------------------------------------------------------------ record
def record(directory: str, snap: Snapshot, kernel_text: str, report: Report, deadline: float) -> str:
    from .. import nvml_fake  # --record also writes the snapshot as a fake NVML config (a replayable fixture)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    host = _hostname()
    out = os.path.join(directory, f"{host}-{stamp}")
    os.makedirs(out, exist_ok=True)
    header = (f"recorded by gpufleet-health --record on {host} at {stamp}; source {snap.source}; "
              f"driver {snap.driver_version}; catalog {CATALOG_VERSION}")
    atomic_write(os.path.join(out, "snapshot.json"),
                 json.dumps({"_comment": header, "snapshot": snap.to_dict()}, indent=1, sort_keys=True))
    atomic_write(os.path.join(out, "fake-nvml.json"),
                 json.dumps(nvml_fake.fake_config_from_snapshot(snap), indent=1, sort_keys=True))
    atomic_write(os.path.join(out, "kmsg.log"),
                 f"# {header}\n# content: kernel log records as read (raw /dev/kmsg format)\n"
                 f"# ---- verbatim below this line ----\n{kernel_text}")
    atomic_write(os.path.join(out, "report.json"), json.dumps(report.to_dict(), indent=1))
    smi = _nvidia_smi_xml(deadline)
    if smi is not None:
        atomic_write(os.path.join(out, "nvidia-smi-q-x.xml"), smi)
    return out


def _nvidia_smi_xml(deadline: float) -> Optional[str]:
    import shutil
    import subprocess
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        # the node agent runs as a systemd/Slurm program, not under AnsibleModule: no run_command
        # pylint: disable-next=ansible-bad-function
        p = subprocess.run([exe, "-q", "-x"], capture_output=True, text=True, timeout=deadline, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


# ------------------------------------------------------------------ output
def table(report: Report, node: str, notes: List[str], slurm: Optional[Dict[str, Any]]) -> str:
    out = [f"{node}: {report.summary}"]
    rows = [("SEVERITY", "CHECK", "GPU", "CODE", "ACTION", "DETAIL")]
    order = {"critical": 0, "unknown": 1, "warning": 2, "info": 3}
    for f in sorted(report.findings, key=lambda f: order[f.severity]):
        rows.append((f.severity, f.check, "-" if f.gpu is None else str(f.gpu), f.code, f.action, f.detail))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            out.append("  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5])
    if report.drain and report.verdict != "unhealthy":
        out.append("drain requested: take the node out of service and investigate (no automatic repair applies)")
    for n in notes:
        out.append(f"note: {n}")
    if slurm and slurm.get("action") != "none":
        out.append(f"slurm: {slurm['action']} {slurm['node']}" + (f" ({slurm.get('detail')})"
                                                                  if slurm.get("detail") else ""))
    return "\n".join(out)


def check(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    notes: List[str] = []
    cfg = _load_mapping(args.config, "--config") if args.config else {}
    if args.expected_gpus is not None:
        if args.expected_gpus < 0:
            raise UsageError("--expected-gpus: expected an integer >= 0")
        cfg["expected_gpus"] = args.expected_gpus
    if args.as_of:
        cfg["events_as_of"] = args.as_of
    elif args.kmsg and args.kmsg != "-":
        cfg.setdefault("events_as_of", "latest")
    cfg.pop("state_path", None)  # the agent owns the state file (it adds the kmsg cursor)
    limits = _load_limits(args.repair_config) if args.slurm else None
    state: Dict[str, Any] = load_state(args.state_file) if args.state_file else {}
    snap = _snapshot(args)
    if snap.hostname is None:
        snap.hostname = _hostname()
    lines, cursor = _kernel_lines(args, state, notes)
    now = time.time() if args.now is None else args.now  # the body reads the clock; the brain is given it
    try:
        report = judge(snap, lines, config=cfg, state=state, now=now, repaired_at=args.repaired_at)
    except ValueError as exc:
        raise UsageError(str(exc))
    counters = metrics.update_counters(state.get("metrics"), snap, lines) if args.textfile else state.get("metrics")
    if args.state_file:
        new_state = dict(report.state or {})
        new_state["kmsg_cursor"] = cursor if cursor is not None else state.get("kmsg_cursor")
        if counters is not None:
            new_state["metrics"] = counters
        try:
            save_state(args.state_file, new_state)
        except OSError as exc:
            notes.append(f"state not saved: {args.state_file}: {exc.strerror or exc}")
    name = node_name(args)
    slurm = slurm_act(report, name, limits=limits) if args.slurm else None
    if slurm and slurm["action"] == "error":
        notes.append(f"slurm: {slurm.get('detail')}")
    if slurm and slurm.get("breaker"):
        notes.append(slurm["breaker"])
        _shout(f"{name}: {slurm['breaker']} ({slurm['action']}: {slurm.get('reason')})")
    if args.record:
        kernel_text = lines if isinstance(lines, str) else "\n".join(getattr(e, "raw", str(e)) for e in lines)
        notes.append(f"recorded to {record(args.record, snap, kernel_text, report, args.deadline)}")
    duration = time.perf_counter() - t0
    if args.textfile:
        try:
            # atomically: node_exporter never reads half a file
            atomic_write(os.path.join(args.textfile, PROM_FILE),
                         metrics.prometheus_text(report, snap, duration, name, slurm, counters))
        except OSError as exc:
            notes.append(f"textfile not written: {args.textfile}: {exc.strerror or exc}")
    d = report.to_dict()
    d.update({"node": name, "checked_at": report.checked_at, "catalog_version": CATALOG_VERSION,
              "probe": {"source": snap.source, "status": snap.probe_status, "error": snap.probe_error,
                        "gpus": len(snap.gpus)},
              "notes": notes})
    if slurm is not None:
        d["slurm"] = slurm
    if args.report_file:
        try:
            atomic_write(args.report_file, json.dumps(d, indent=1) + "\n", mode=0o644)
        except OSError as exc:
            notes.append(f"report not written: {args.report_file}: {exc.strerror or exc}")
    if args.json:
        sys.stdout.write(json.dumps(d, indent=1) + "\n")
    else:
        sys.stdout.write(table(report, name, notes, slurm) + "\n")
    return report.exit_code


def main(argv: Optional[List[str]] = None) -> int:
    _fix_environment()
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "check":
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return check(args)
    except UsageError as exc:
        sys.stderr.write(f"gpufleet-health: {exc}\n")
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover - python -m ...cli.health_agent (how the role's wrapper runs it)
    raise SystemExit(main())
