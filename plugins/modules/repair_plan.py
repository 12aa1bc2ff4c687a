# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: repair_plan
short_description: Compute the fleet-wide node repair plan from Slurm and the latest health reports
version_added: "0.1.0"
description:
  - Reads every node from Slurm (through the collection's Slurm adapter), the latest GPU health reports and each
    node's compact repair history (stored in the node's Slurm C(Extra) or C(Comment) field), and asks the repair
    policy for one decision per node that needs attention - V(wait), V(drain), V(reset_gpu), V(reboot),
    V(reimage), V(replace), V(resume), V(escalate) or V(hold) - with a reason, an earliest time, whether it
    needs approval, hot-spare moves and replacement-hook calls.
  - Changes nothing in Slurm. The C(gpufleet.reliability.node_repair) role executes the runnable decisions.
  - The circuit breaker state is read from O(breaker_state_file) and saved there when it changes (a trip or a
    reset). The breaker fails closed - a state file that cannot be read or saved holds the whole fleet this run,
    as a trip does (RV(breaker) says why), and Slurm keeps the trip as well - nodes still showing the breaker's
    hold, set after the last reset, trip it again on the next run even when the file never got the trip.
  - Writes the plan to O(publish_dir) when set.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes.no_diff
  - gpufleet.reliability.slurm
options:
  config:
    description:
      - Repair policy settings (ttl, cooldown, budget, escalate, lemon, ladders, modes, blast_radius, breaker,
        spares, step_timeout, reason_prefix, class_map, hook_actions, resume_degraded, history_keep). See
        docs/repair.md. Unknown keys are errors.
    type: dict
    default: {}
  approvals:
    description:
      - Approved steps, each C(node:action:incident) (the C(approval) of a decision in a published plan).
      - In approval mode only these steps run.
    type: list
    elements: str
    default: []
  approvals_file:
    description:
      - A JSON file with a list of approvals (strings C(node:action:incident)), added to O(approvals).
      - A missing file means no approvals.
    type: path
  reports:
    description:
      - Latest health reports by node name (the C(report) returned by C(gpufleet.reliability.gpu_health) or
        written by the agent).
    type: dict
    default: {}
  fetched_reports:
    description:
      - Report files fetched from the nodes this run, by node name, as base64 text (what C(ansible.builtin.slurp)
        returns as C(content)) - the node agent's own C(report.json), for the nodes a first plan listed in
        RV(blind). They win over O(reports_dir); a fetched report that names another node, or cannot be read, holds
        that node (as a bad file does).
    type: dict
    default: {}
  reports_dir:
    description:
      - Directory with one report per node, C(<node>.json). The file's C(checked_at) (or its mtime) is the report
        time. Reports in O(reports) win.
      - A file that cannot be read or is not a health report holds that node only (the decision names the file and
        the problem); a bad file of a node Slurm does not know is reported in RV(warnings_reports) and ignored.
    type: path
  breaker_state_file:
    description:
      - JSON file with the persisted circuit-breaker state, read at the start and replaced atomically (mode 0640)
        when the state changes. Missing means not tripped (unless Slurm shows the breaker's hold). Its directory is
        created (mode 0750) when missing.
      - Not written in check mode.
    type: path
  publish_dir:
    description:
      - An existing directory to write the plan to, as C(plan.json) (replaced atomically, mode 0644), for people
        and tools that look at the last run.
      - Not written in check mode.
    type: path
  lock_file:
    description:
      - One repair run at a time - the run lock, in the controller's state directory. The plan is made only when
        this run holds it; it is held for the life of the run's C(ansible-playbook) process (a run that ends or is
        killed frees it) and names its holder (PID, host, since when). A second run fails at once, changing
        nothing, with a message that names the holder, unless the holder ends within O(lock_wait).
      - Not taken in check mode (a check run changes nothing). Unset - no lock. Its directory is created (mode
        0750) when missing.
    type: path
  lock_wait:
    description:
      - Seconds to wait for a run that holds O(lock_file) to end (the event loop queues behind a scheduled run).
    type: float
    default: 0
  lock_lease:
    description:
      - Seconds a lock taken on another host (a state directory shared by controllers) counts, since its holder
        cannot be checked from here.
    type: float
    default: 14400
  breaker_reset:
    description:
      - Reset a tripped breaker (a person decided the cause is gone). Failures first seen before now no longer count.
    type: bool
    default: false
  history_field:
    description:
      - Slurm node field that holds the repair history.
    type: str
    choices: [extra, comment]
    default: extra
  spare_reason:
    description:
      - Hot spares are nodes drained with a reason that starts with this text. Empty disables spares.
    type: str
    default: "gpufleet: spare"
  partitions:
    description:
      - Only nodes in these partitions. Default all.
    type: list
    elements: str
    default: []
  domain_prefixes:
    description:
      - Failure domains from node features, kind to feature prefix (C(rack_r12) or C(rack=r12)).
    type: dict
    default: {rack: rack, switch: switch}
  now:
    description:
      - Epoch seconds to plan for (tests and replays). Default the controller's clock.
    type: float
  scontrol:
    description:
      - Path or name of C(scontrol).
    type: str
    default: scontrol
  sinfo:
    description:
      - Path or name of C(sinfo).
    type: str
    default: sinfo
seealso:
  - module: gpufleet.reliability.repair_step
"""

EXAMPLES = r"""
- name: Plan repairs (changes nothing)
  gpufleet.reliability.repair_plan:
    reports_dir: /var/lib/gpufleet/reports
    breaker_state_file: /var/lib/gpufleet/breaker.json
    config:
      modes: {default: automatic, gpu_lost: approval}
      blast_radius: {max_unavailable: "10%", domains: {rack: 2}}
  register: repair

- name: Show what would run now
  ansible.builtin.debug:
    msg: "{{ repair.runnable | map(attribute='node') | list }}"
"""

RETURN = r"""
plan:
  description: The whole plan.
  returned: always
  type: dict
  contains:
    decisions:
      description: One decision per node that needs attention (node, action, reason, earliest, needs_approval,
        approved, runnable, verify, failure_class, incident, partition, code, gpu, spare, hook, history,
        history_after, stored_history, rule, approval, slurm_reason, since - the start of the repair step a
        verification after this decision checks - and jobs, the job part of an C(evict) decision with action,
        phase (signal or requeue), job_ids, signal, signal_to, grace, kept and waits_for_nodes).
      type: list
      elements: dict
    breaker:
      description: Circuit breaker state to persist.
      type: dict
    spare_moves:
      description: Spares to bring in (spare, partition, for_node).
      type: list
      elements: dict
    hook_calls:
      description: Replacement / re-image hook calls (action, node, incident, idempotency_key, reason).
      type: list
      elements: dict
    notes:
      description: Fleet-wide notes (breaker).
      type: list
      elements: str
    unused_approvals:
      description: Approvals that matched no decision.
      type: list
      elements: list
    counts:
      description: Decisions per action.
      type: dict
runnable:
  description: The decisions that may run now (not waiting, not held, approved where needed).
  returned: always
  type: list
  elements: dict
pending_approval:
  description: Decisions waiting for approval, with their approval string.
  returned: always
  type: list
  elements: dict
breaker:
  description: Circuit breaker state to persist (same as RV(plan.breaker)).
  returned: always
  type: dict
lock:
  description: The run lock this run holds (PID, start time, host, since), or null without O(lock_file) or in
    check mode.
  returned: always
  type: dict
breaker_changed:
  description: Whether the breaker state differs from O(breaker_state_file) (it was saved, or in check mode would
    be).
  returned: always
  type: bool
written:
  description: The files written (or, in check mode, that would be written) - the breaker state and the plan.
  returned: always
  type: list
  elements: str
fleet:
  description: The fleet summary the plan was made from (counts per partition and domain).
  returned: always
  type: dict
spares:
  description: Hot spare node names found.
  returned: always
  type: list
  elements: str
now:
  description: The time the plan is for.
  returned: always
  type: float
blind:
  description: The nodes this plan would repair without a health report (the probe ladder, a reboot first, chosen
    for want of a finding). The node_repair role fetches their agents' reports and plans again with
    O(fetched_reports).
  returned: always
  type: list
  elements: str
warnings_reports:
  description: Report files that could not be used, by node name, with why (the node is held when Slurm knows it).
  returned: always
  type: dict
"""

import base64
import json
import math
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write, differs
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import (
    BreakerState,
    RepairConfig,
    RepairError,
    blind,
    plan,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.runlock import RunLockBusy, acquire
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import SlurmError
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm.repair_inputs import read_jobs, repair_inputs
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm_module import (
    SLURM_COMMON_ARGS,
    client_from_module,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import SPARE_REASON

#: Bytes of one health report that are read (a report is a few kB).
MAX_REPORT = 4 << 20


def _read_json(module: AnsibleModule, path: str, what: str) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"{what} {path}: cannot read JSON: {exc}")


def _report_text(raw: bytes, where: str) -> Tuple[Optional[Dict[str, Any]], Optional[float], str, Any]:
    """One report file's bytes -> (report, its time or None, why it cannot be used or "", the file's JSON).
    Reports come from nodes: anything may be in them."""
    try:
        top = data = json.loads(raw[:MAX_REPORT].decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        return None, None, f"{where}: cannot read JSON: {str(exc)[:200]}", None
    if isinstance(data, dict) and isinstance(data.get("report"), dict):  # gpu_health module / agent wrapper
        t = data.get("checked_at") or data["report"].get("checked_at")
        data = data["report"]
    else:
        t = data.get("checked_at") if isinstance(data, dict) else None
    if not isinstance(data, dict) or "verdict" not in data:
        return None, None, f"{where}: expected a health report with a verdict", top
    ok_time = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
    return data, (float(t) if ok_time else None), "", top


def _reports_from_dir(module: AnsibleModule, path: Optional[str]
                      ) -> Tuple[Dict[str, Any], Dict[str, Optional[float]], Dict[str, str]]:
    """-> (reports, times, errors): a file that cannot be used is an error of that node only, never of the run."""
    reports: Dict[str, Any] = {}
    times: Dict[str, Optional[float]] = {}
    errors: Dict[str, str] = {}
    if not path:
        return reports, times, errors
    if not os.path.isdir(path):
        module.fail_json(msg=f"reports_dir {path}: not a directory")
    for entry in sorted(os.listdir(path)):
        if not entry.endswith(".json") or entry.startswith("."):
            continue
        full = os.path.join(path, entry)
        name = entry[: -len(".json")]
        try:
            with open(full, "rb") as fh:
                raw = fh.read(MAX_REPORT)
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors[name] = f"{full}: cannot read JSON: {str(exc)[:200]}"
            continue
        data, t, error, _top = _report_text(raw, full)
        if data is None:
            errors[name] = error
            continue
        reports[name] = data
        if t is None:
            try:
                t = os.stat(full).st_mtime
            except OSError:
                t = None
        times[name] = t
    return reports, times, errors


def _fetched(fetched: Dict[str, Any], now: float
             ) -> Tuple[Dict[str, Any], Dict[str, Optional[float]], Dict[str, str]]:
    """O(fetched_reports) -> (reports, times, errors), as the directory's files are read. A report that names
    another node than the one it was fetched from is not used."""
    reports: Dict[str, Any] = {}
    times: Dict[str, Optional[float]] = {}
    errors: Dict[str, str] = {}
    for name, content in fetched.items():
        where = f"fetched_reports.{name}"
        try:
            raw = base64.b64decode(str(content)[:MAX_REPORT * 2], validate=True)
        except (ValueError, TypeError) as exc:
            errors[name] = f"{where}: expected the base64 text of a report file: {exc}"
            continue
        data, t, error, top = _report_text(raw, where)
        if data is None:
            errors[name] = error
            continue
        owner = top.get("node", data.get("node"))
        if owner is not None and owner != name:
            errors[name] = f"{where}: the report is of node {str(owner)[:64]!r}, not of {name}"
            continue
        reports[name] = data
        times[name] = t if t is not None else now
    return reports, times, errors


def _make_parent(module: AnsibleModule, key: str) -> None:
    """Create the directory of option ``key``'s file (mode 0750) when it is missing, or fail naming the option."""
    parent = os.path.dirname(os.path.abspath(module.params[key]))
    if os.path.isdir(parent):
        return
    try:
        os.makedirs(parent, 0o750, exist_ok=True)
    except OSError as exc:
        module.fail_json(msg=f"{key}: cannot create its directory {parent}: {exc}")


def _closed(why: str, breaker: BreakerState, now: float) -> BreakerState:
    """The breaker held closed for this run because its state cannot be trusted or saved."""
    return BreakerState(tripped=True, since=now, reason=why + "; held closed until it is fixed and a person resets "
                        "the breaker", reset_at=breaker.reset_at, nodes=list(breaker.nodes))


def _stored_breaker(path: Optional[str], now: float) -> Tuple[Optional[Dict[str, Any]], BreakerState]:
    """(the stored state as saved, or None; the state to plan with). Fails closed: a file that cannot be read or is
    not a breaker state holds the fleet (a person's reset replaces it)."""
    if not path:
        return None, BreakerState()
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        brk = BreakerState.from_dict(data)
    except FileNotFoundError:
        return None, BreakerState()
    except (OSError, ValueError, RecursionError, RepairError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)[:200]
        return {}, _closed(f"breaker_state_file {path}: unreadable ({why})", BreakerState(), now)
    return brk.to_dict(), brk


def _approvals(module: AnsibleModule) -> List[str]:
    out = list(module.params["approvals"])
    path = module.params["approvals_file"]
    if path:
        data = _read_json(module, path, "approvals_file")
        if data is None:
            return out
        if isinstance(data, dict):
            data = data.get("approvals", [])
        if not isinstance(data, list) or not all(isinstance(a, str) for a in data):
            module.fail_json(msg=f"approvals_file {path}: expected a JSON list of 'node:action:incident' strings")
        out += data
    return out


def main() -> None:
    argument_spec = dict(
        config=dict(type="dict", default={}),
        approvals=dict(type="list", elements="str", default=[]),
        approvals_file=dict(type="path"),
        reports=dict(type="dict", default={}),
        fetched_reports=dict(type="dict", default={}),
        reports_dir=dict(type="path"),
        breaker_state_file=dict(type="path"),
        publish_dir=dict(type="path"),
        breaker_reset=dict(type="bool", default=False),
        lock_file=dict(type="path"),
        lock_wait=dict(type="float", default=0),
        lock_lease=dict(type="float", default=14400),
        history_field=dict(type="str", choices=["extra", "comment"], default="extra"),
        spare_reason=dict(type="str", default=SPARE_REASON),
        partitions=dict(type="list", elements="str", default=[]),
        domain_prefixes=dict(type="dict", default={"rack": "rack", "switch": "switch"}),
        now=dict(type="float"),
        scontrol=dict(type="str", default="scontrol"),
        sinfo=dict(type="str", default="sinfo"),
    )
    argument_spec.update(SLURM_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    now = p["now"] if p["now"] is not None else time.time()
    if p["lock_wait"] < 0 or p["lock_lease"] <= 0:
        module.fail_json(msg=f"lock_wait: expected seconds >= 0, lock_lease: seconds > 0; got {p['lock_wait']}, "
                             f"{p['lock_lease']}")
    if p["publish_dir"] and not os.path.isdir(p["publish_dir"]):
        module.fail_json(msg=f"publish_dir: expected an existing directory, got {p['publish_dir']}")
    if not module.check_mode:
        for key in ("lock_file", "breaker_state_file"):
            if p[key]:
                _make_parent(module, key)
    lock = None
    if p["lock_file"] and not module.check_mode:
        try:
            lock = acquire(p["lock_file"], p["lock_wait"], p["lock_lease"])
        except RunLockBusy as exc:
            module.fail_json(msg=str(exc), lock_holder=exc.holder)
        except OSError as exc:
            module.fail_json(msg=f"lock_file: cannot take the run lock {p['lock_file']}: {exc}")

    client = client_from_module(module)
    try:
        nodes = client.nodes()
    except SlurmError as exc:
        module.fail_json(msg=f"reading nodes from Slurm: {exc}", error=exc.to_dict())

    reports, times, report_errors = _reports_from_dir(module, p["reports_dir"])
    got, got_times, got_errors = _fetched(p["fetched_reports"] or {}, now)
    for name in set(got) | set(got_errors):  # fetched from the node itself, this run: newer than a file here
        reports.pop(name, None)
        report_errors.pop(name, None)
        times.pop(name, None)
    reports.update(got)
    times.update(got_times)
    report_errors.update(got_errors)
    for name, rep in (p["reports"] or {}).items():
        if isinstance(rep, dict) and isinstance(rep.get("report"), dict):
            times[name] = rep.get("checked_at") or now
            rep = rep["report"]
        reports[name] = rep
        report_errors.pop(name, None)
        times.setdefault(name, now)

    # the adapter turns Slurm's nodes into the policy's typed inputs (the history read once, here)
    inputs = repair_inputs(
        nodes.values(), reports, {n: t for n, t in times.items() if t is not None},
        history_field=p["history_field"], spare_reason=p["spare_reason"],
        partitions=p["partitions"] or None, domain_prefixes=p["domain_prefixes"], report_errors=report_errors,
    )
    try:
        config = RepairConfig.from_dict(p["config"])
    except RepairError as exc:
        module.fail_json(msg=str(exc))
    # the jobs on the busy nodes we drained, and those an eviction under way follows: what the job action reads
    job_errors = read_jobs(inputs.nodes, client.node_jobs, config.reason_prefix)
    for name in sorted(job_errors):
        module.warn(f"the jobs on {name} could not be read, so none is evicted there: {job_errors[name]}")
    for name in sorted(set(report_errors) - set(nodes)):
        module.warn(f"report of {name}, a node Slurm does not know, ignored: {report_errors[name]}")
    stored, breaker = _stored_breaker(p["breaker_state_file"], now)
    if p["breaker_reset"]:
        breaker = breaker.reset(now)
    approvals = _approvals(module)

    def make_plan(brk: BreakerState) -> Dict[str, Any]:
        try:
            return plan(inputs.fleet, inputs.nodes, config, now, approvals=approvals, breaker=brk).to_dict()
        except RepairError as exc:
            module.fail_json(msg=str(exc))

    out = make_plan(breaker)
    written = []
    new_breaker = out["breaker"]
    # a file that could not be read ({}) is left for a person to look at, until their reset replaces it
    breaker_changed = (BreakerState().to_dict() if stored is None else stored) != new_breaker
    if p["breaker_state_file"] and breaker_changed and (stored != {} or p["breaker_reset"]):
        written.append(p["breaker_state_file"])
        if not module.check_mode:
            try:
                atomic_write(p["breaker_state_file"], json.dumps(new_breaker, indent=4, sort_keys=True) + "\n", 0o640)
            except OSError as exc:  # fail closed: a trip or a reset that cannot be saved holds the fleet
                out = make_plan(_closed(f"breaker_state_file {p['breaker_state_file']}: cannot save the breaker state "
                                        f"({exc.strerror or exc})", breaker, now))
                new_breaker = out["breaker"]
                written.pop()
    field = p["history_field"]
    for d in out["decisions"]:
        d["approval"] = f"{d['node']}:{d['action']}:{d['incident'] or '-'}"
        node = nodes.get(d["node"])
        d["stored_history"] = (getattr(node, field) or "") if node is not None else ""
    runnable = [d for d in out["decisions"] if d["runnable"]]
    pending = [d for d in out["decisions"] if d["needs_approval"]]
    if p["publish_dir"]:
        path = os.path.join(p["publish_dir"], "plan.json")
        text = json.dumps(out, indent=4, sort_keys=True) + "\n"
        if differs(path, text):
            written.append(path)
            if not module.check_mode:
                try:
                    atomic_write(path, text, 0o644)
                except OSError as exc:
                    module.fail_json(msg=f"publish_dir: cannot write {path}: {exc}")
    module.exit_json(
        changed=bool(written),
        written=written,
        plan=out,
        runnable=runnable,
        pending_approval=pending,
        breaker=new_breaker,
        breaker_changed=breaker_changed,
        lock=lock,
        fleet=inputs.counts,
        spares=inputs.spares,
        now=now,
        warnings_reports=report_errors,
        blind=blind(out["decisions"]),
    )


if __name__ == "__main__":
    main()
