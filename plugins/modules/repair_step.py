# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: repair_step
short_description: The Slurm side of one node repair step (history, drain, reboot, escalate, resume, spare)
version_added: "0.1.0"
description:
  - Carries out the Slurm part of a decision of C(gpufleet.reliability.repair_plan) for one node, through the
    collection's Slurm adapter, and keeps the node's compact repair history in its C(Extra) (or C(Comment)) field.
  - O(op=record) writes O(history). O(op=ran) records in the stored history that the pending step ran, now (the
    proof a GPU reset leaves right after it returned). O(op=outcome) records the verification result of the
    pending step (O(outcome)) into the stored history (an C(ok) closes the incident and starts the cooldown) -
    only when the step is proven to have run (its own record, or for a reboot a boot of the node after the
    step's intent); otherwise it records C(unproven) - the step did not happen as far as anyone can show, and the
    next plan offers it again instead of the next, more drastic step. With O(resume), an C(ok) outcome also
    resumes the node in the same Slurm update, when it is out of service by us; a node out of service by someone
    else keeps their reason, and the module fails after recording the outcome.
  - O(op=drain) drains with O(reason) (which must start with O(reason_prefix)). O(op=reboot) runs
    C(scontrol reboot ASAP nextstate=DOWN reason=...), so the node comes back DOWN and is only resumed after it
    has been verified. O(op=escalate) replaces the drain reason with O(reason) (the node stays out of service).
  - O(op=resume) resumes the node only when it is drained or down with a reason that starts with
    O(reason_prefix) - a node drained by someone else is never resumed (the module fails instead).
    O(op=spare_in) resumes a hot spare, only when its reason starts with O(spare_reason).
  - O(op=check) changes nothing and fails when the node is not ours to act on any more - out of service with a
    reason that does not start with O(reason_prefix), or its O(history_field) holds text that is not a readable
    gpufleet history. The role runs it right before every step that leaves the controller (GPU reset, reboot,
    replacement hook), so that an operator's drain made during the run wins. With O(history), the history is
    written once the node has passed the check (the step's intent, recorded with the same read).
  - O(op=note) sets O(reason) on a node that is out of service by us (why it is held); a node in service or out of
    service by someone else is left alone (C(changed=false)).
  - O(op=status) changes nothing and returns the node.
  - Every write is skipped when the node is already in the wanted state (C(changed=false)).
  - Slurm is read once (the node alone on Slurm 23.02 and later) and changed with at most one C(scontrol update)
    (the history and the state together), plus C(scontrol reboot) for O(op=reboot).
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
  - gpufleet.reliability.slurm
options:
  node:
    description: Node name.
    type: str
    required: true
  op:
    description: What to do (see the description).
    type: str
    required: true
    choices: [record, ran, outcome, drain, reboot, escalate, resume, spare_in, check, note, status]
  history:
    description: History text to store (O(op=record)); also stored by the other write operations when given.
    type: str
  outcome:
    description: Verification result for O(op=outcome).
    type: str
    choices: [ok, failed, timeout]
  resume:
    description: With O(op=outcome) and O(outcome=ok), resume the node in the same update (only when it is out of
      service by us).
    type: bool
    default: false
  cooldown:
    description: Seconds of cooldown an C(ok) outcome starts.
    type: float
    default: 1800
  reason:
    description: Slurm reason for O(op=drain), O(op=reboot), O(op=escalate), O(op=note).
    type: str
  reason_prefix:
    description: Our reasons start with this; only such nodes are resumed.
    type: str
    default: "gpufleet:"
  spare_reason:
    description: Hot spares are drained with a reason that starts with this.
    type: str
    default: "gpufleet: spare"
  history_field:
    description: Node field that holds the history.
    type: str
    choices: [extra, comment]
    default: extra
  scontrol:
    description: Path or name of C(scontrol).
    type: str
    default: scontrol
  sinfo:
    description: Path or name of C(sinfo).
    type: str
    default: sinfo
seealso:
  - module: gpufleet.reliability.repair_plan
  - module: gpufleet.reliability.slurm_node
"""

EXAMPLES = r"""
- name: Record the step, then reboot
  gpufleet.reliability.repair_step:
    node: "{{ decision.node }}"
    op: reboot
    history: "{{ decision.history_after }}"
    reason: "gpufleet: reboot {{ decision.code }} (incident {{ decision.incident }})"

- name: Verification passed
  gpufleet.reliability.repair_step:
    node: node2
    op: outcome
    outcome: ok
"""

RETURN = r"""
node:
  description: The node as Slurm showed it before the operation's change (name, state, flags, reason, extra,
    comment, ...); the change itself is in RV(history) and C(changed).
  returned: always
  type: dict
history:
  description: The stored history after the operation.
  returned: always
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.diff import change
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import (
    HistoryError,
    dumps,
    is_ours,
    record_ran,
    record_verification,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import loads_ours
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node, SlurmError
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm_module import (
    SLURM_COMMON_ARGS,
    client_from_module,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import REASON_PREFIX, SPARE_REASON


def main() -> None:
    argument_spec = dict(
        node=dict(type="str", required=True),
        op=dict(type="str", required=True,
                choices=["record", "ran", "outcome", "drain", "reboot", "escalate", "resume", "spare_in", "check",
                         "note", "status"]),
        history=dict(type="str"),
        outcome=dict(type="str", choices=["ok", "failed", "timeout"]),
        resume=dict(type="bool", default=False),
        cooldown=dict(type="float", default=1800),
        reason=dict(type="str"),
        reason_prefix=dict(type="str", default=REASON_PREFIX),
        spare_reason=dict(type="str", default=SPARE_REASON),
        history_field=dict(type="str", choices=["extra", "comment"], default="extra"),
        scontrol=dict(type="str", default="scontrol"),
        sinfo=dict(type="str", default="sinfo"),
    )
    argument_spec.update(SLURM_COMMON_ARGS)
    module = AnsibleModule(
        argument_spec=argument_spec,
        required_if=[("op", "outcome", ["outcome"]), ("op", "record", ["history"]), ("op", "drain", ["reason"]),
                     ("op", "reboot", ["reason"]), ("op", "escalate", ["reason"]), ("op", "note", ["reason"])],
        supports_check_mode=True,
    )
    p = module.params
    name, op, field = p["node"], p["op"], p["history_field"]
    prefix = p["reason_prefix"]

    client = client_from_module(module)

    def read() -> Node:
        try:
            return client.node(name)
        except SlurmError as exc:
            module.fail_json(msg=f"reading node {name}: {exc}", error=exc.to_dict())
            raise  # fail_json exits

    node = read()
    before = node.to_dict()
    current = getattr(node, field) or ""
    if p["reason"] is not None and op in ("drain", "reboot", "escalate", "note") and not p["reason"].startswith(prefix):
        module.fail_json(msg=f"reason: must start with {prefix!r} (our drains are known by it), got {p['reason']!r}")
    try:
        not_ours = node.foreign(prefix)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    foreign = not_ours is not None
    ours = node.drained_by(prefix)
    changes = []

    if op == "check":
        if foreign:
            module.fail_json(msg=f"node {name} is not ours to act on any more: {not_ours}; not touched",
                             node=before, not_ours=not_ours)
        try:
            readable = loads_ours(current) is not None
        except HistoryError as exc:
            module.fail_json(msg=f"node {name}: {field} holds a damaged gpufleet history ({exc}); not touched",
                             node=before)
        if not readable:
            module.fail_json(msg=f"node {name}: {field} holds text that is not a gpufleet history; not touched",
                             node=before)
        if p["history"] is None:
            module.exit_json(changed=False, node=before, history=current)

    new_history = p["history"]
    if op in ("outcome", "ran"):
        if not is_ours(current):
            module.fail_json(msg=f"node {name}: {field} holds text that is not a gpufleet history; not touched")
        try:
            if op == "ran":
                new_history = record_ran(current, time.time())
            else:
                new_history = dumps(record_verification(current, p["outcome"], node, time.time(), p["cooldown"]))
        except HistoryError as exc:
            module.fail_json(msg=f"node {name}: {exc}")
    if new_history is not None and new_history != current:
        if not is_ours(current):
            module.fail_json(msg=f"node {name}: {field} holds text that is not a gpufleet history; not overwritten")
        changes.append(("history", new_history))

    if op == "drain":
        if foreign:
            module.fail_json(msg=f"node {name} is out of service by someone else ({node.reason!r}); not touched")
        if not ("DRAIN" in node.flags and node.reason.split(" [")[0] == p["reason"]):
            changes.append(("drain", p["reason"]))
    elif op == "reboot":
        if foreign:
            module.fail_json(msg=f"node {name} is out of service by someone else ({node.reason!r}); not touched")
        if not node.reboot_pending:
            changes.append(("reboot", p["reason"]))
    elif op == "escalate":
        if foreign:
            module.fail_json(msg=f"node {name} is out of service by someone else ({node.reason!r}); not touched")
        # a reason counts only while the node is out of service: Slurm 24.11 keeps the last one after RESUME
        if not (node.out_of_service and node.reason == p["reason"]):
            changes.append(("drain", p["reason"]))
    elif op == "outcome" and p["resume"] and p["outcome"] == "ok" and not foreign and ours:
        changes.append(("resume", None))
    elif op == "resume":
        if foreign:
            module.fail_json(msg=f"node {name} was not drained by us (reason {node.reason!r}); never resumed")
        if ours:
            changes.append(("resume", None))
    elif op == "note":
        if ours and node.reason != p["reason"]:
            changes.append(("drain", p["reason"]))
    elif op == "spare_in" and node.out_of_service:
        if not node.reason.startswith(p["spare_reason"]):
            module.fail_json(msg=f"node {name} is not a hot spare (reason {node.reason!r}); not resumed")
        changes.append(("resume", None))

    stored = new_history if new_history is not None and changes else current
    diff = change(f"slurm node {name}", {"history": current, "reason": node.reason},
                  {"history": stored, "ops": [c[0] for c in changes]})
    done = []
    if not module.check_mode:
        update = {what: arg for what, arg in changes if what != "reboot"}
        state = next(({"drain": "DRAIN", "resume": "RESUME"}[w] for w in update if w != "history"), None)
        try:
            if update:
                client.update_node(name, history_field=field, history=update.get("history"), state=state,
                                   reason=update.get("drain"))
                done += list(update)
            for what, arg in changes:
                if what == "reboot":
                    client.reboot(name, arg, nextstate="down", asap=True)
                    done.append(what)
        except SlurmError as exc:
            module.fail_json(msg=f"node {name}: {exc}", error=exc.to_dict(), done=done, node=before)
    if op == "outcome" and p["resume"] and p["outcome"] == "ok" and foreign:
        module.fail_json(msg=f"node {name} is out of service by someone else ({node.reason!r}): the outcome is "
                             "recorded, the node is never resumed", changed=bool(changes), node=before,
                         history=stored, diff=diff)
    module.exit_json(changed=bool(changes), node=before, history=stored, diff=diff)


if __name__ == "__main__":
    main()
