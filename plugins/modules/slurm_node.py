#!/usr/bin/python
# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_node
short_description: Drain, resume, down or reboot Slurm nodes, idempotently and in one batch
version_added: "0.1.0"
description:
  - Sets the state of one or more Slurm nodes, given as a node name or a hostlist expression
    (C(gpu[001-064],spare3)).
  - Reads every node first and changes only those that are not yet in the requested state, with one
    C(scontrol update NodeName=<hostlist>) (or one C(scontrol reboot)) for all of them. An unknown node fails the
    task before anything changes.
  - Supports check mode (nothing is changed, the plan is returned) and diff mode (state, flags and reason of each
    node before and after).
  - V(state=resumed) with O(only_if_reason_prefix) resumes only nodes whose drain or down reason starts with that
    prefix, so that automation undoes only its own drains and never a drain someone else set.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
  - gpufleet.reliability.slurm
options:
  name:
    description:
      - Node name or Slurm hostlist expression; several may be separated by commas.
    type: str
    required: true
    aliases: [nodes]
  state:
    description:
      - V(drained) sets DRAIN (running jobs finish, no new ones start). A node that already has the DRAIN flag is
        left as it is, whatever its reason.
      - V(resumed) clears DRAIN / DOWN / FAIL. Nodes that are not drained, down or failed are left alone.
      - V(down) sets the node DOWN (running jobs are killed). A node already down is left alone.
      - V(rebooted) asks Slurm to reboot the node through its RebootProgram (C(scontrol reboot ASAP) by default),
        after which it goes to O(nextstate). A node with a reboot already pending is left alone, and so is one
        that booted at or after O(skip_if_booted_since).
    type: str
    required: true
    choices: [drained, resumed, down, rebooted]
  reason:
    description:
      - Why. Required with V(state=drained) and V(state=down); optional with V(state=rebooted).
      - Start it with C(gpufleet:) for drains made by automation, so that O(only_if_reason_prefix) and the
        inventory group C(slurm_reason_gpufleet) find them.
    type: str
  nextstate:
    description:
      - With V(state=rebooted), the state Slurm puts the node in after the reboot.
    type: str
    choices: [resume, down]
    default: resume
  asap:
    description:
      - With V(state=rebooted), drain the node so the reboot happens as soon as its jobs end (C(ASAP)). With
        V(false), the reboot waits for the node to be idle and other jobs may still start.
    type: bool
    default: true
  skip_if_booted_since:
    description:
      - With V(state=rebooted), an epoch time; nodes whose Slurm boot time is at or after it count as rebooted
        already. Captured once (for example at the start of a play), it makes a reboot task idempotent.
    type: int
  only_if_reason_prefix:
    description:
      - With V(state=resumed), resume only nodes whose reason starts with this string; other drained or down
        nodes are reported in RV(skipped_nodes) and left alone.
      - With V(state=rebooted), leave alone (and report in RV(skipped_nodes)) every node that is drained, down or
        failed with a reason that does not start with this string, so that a reboot never overwrites somebody
        else's reason. Nodes in service are rebooted.
    type: str
  wait:
    description:
      - Wait until the change is complete, polling Slurm first after O(poll_interval) seconds, then each time half
        again as long after the poll before, up to 10 seconds apart (or O(poll_interval) when that is longer).
      - V(drained) waits until no job is left on the nodes (DRAINED, not DRAINING); V(resumed) until they respond
        and are not drained or down; V(rebooted) until the reboot is done (no reboot flag, a new boot time, the
        node responding). V(down) takes effect at once.
    type: bool
    default: false
  timeout:
    description:
      - Seconds to wait with O(wait) before the task fails, naming the nodes that are not there yet.
    type: int
    default: 300
  poll_interval:
    description:
      - Seconds before the first poll with O(wait) (later polls back off, see O(wait)).
    type: float
    default: 1.0
seealso:
  - module: gpufleet.reliability.slurm_stuck
  - name: scontrol(1)
    description: The Slurm command the module drives.
    link: https://slurm.schedmd.com/scontrol.html
"""

EXAMPLES = r"""
- name: Drain a node the health agent flagged (once, on the controller)
  gpufleet.reliability.slurm_node:
    name: gpu017
    state: drained
    reason: "gpufleet: xid79 gpu3"
  delegate_to: "{{ slurm_controller }}"
  run_once: true

- name: Drain a whole rack and wait until its jobs are gone
  gpufleet.reliability.slurm_node:
    name: "gpu[033-048]"
    state: drained
    reason: "gpufleet: rack r7 switch maintenance"
    wait: true
    timeout: 3600

- name: Resume only the nodes we drained ourselves
  gpufleet.reliability.slurm_node:
    name: "{{ groups['slurm_reason_gpufleet'] | join(',') }}"
    state: resumed
    only_if_reason_prefix: "gpufleet:"

- name: Reboot as soon as jobs end, come back DOWN for verification, once per play
  gpufleet.reliability.slurm_node:
    name: gpu017
    state: rebooted
    reason: "gpufleet: reboot after xid79"
    nextstate: down
    skip_if_booted_since: "{{ play_started_epoch }}"
    wait: true
    timeout: 1800
"""

RETURN = r"""
nodes:
  description: The node names the task was about (the expanded hostlist).
  returned: always
  type: list
  elements: str
  sample: [node1, node2]
changed_nodes:
  description: The nodes that were changed (or, in check mode, would be).
  returned: always
  type: list
  elements: str
  sample: [node2]
skipped_nodes:
  description: Nodes left alone, with why (already in the state, reason prefix does not match, reboot pending).
  returned: always
  type: dict
  sample: {node1: already drained, node3: "reason 'maintenance' does not start with 'gpufleet:'"}
before:
  description: Each node as Slurm reported it before the task (state, flags, reason, reason_user, reason_time,
    partitions, features, gres, gres_used, comment, extra, boot_time, drained, draining, sinfo_state...).
  returned: always
  type: dict
  sample: {node2: {state: idle, flags: [], reason: "", sinfo_state: idle}}
after:
  description: Each node as Slurm reports it after the task (in check mode, the state it would be in).
  returned: always
  type: dict
  sample: {node2: {state: idle, flags: [DRAIN], reason: "gpufleet: xid79 gpu3", sinfo_state: drained}}
backend:
  description: The backend used (V(cli) or V(pyslurm)) and why.
  returned: always
  type: str
  sample: "cli (pyslurm not importable)"
commands:
  description: The Slurm commands run (reads included).
  returned: always
  type: list
  elements: list
waited:
  description: Seconds spent waiting with O(wait).
  returned: always
  type: float
  sample: 1.3
"""

from typing import Any, Dict, List, Mapping, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.diff import change
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import (
    Node,
    SlurmError,
    WaitTimeout,
    wait_for_nodes,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm_module import (
    SLURM_COMMON_ARGS,
    client_from_module,
    fail_slurm,
)


def _brief(node: Node) -> Dict[str, Any]:
    return {"state": node.state, "flags": sorted(node.flags), "reason": node.reason, "sinfo_state": node.sinfo_state}


def _plan(nodes: Mapping[str, Node], p: Mapping[str, Any]) -> Tuple[List[str], Dict[str, str], Dict[str, Node]]:
    """-> (targets, skipped, predicted after-state per target)."""
    state = p["state"]
    prefix = p["only_if_reason_prefix"]
    targets: List[str] = []
    skipped: Dict[str, str] = {}
    predicted: Dict[str, Node] = {}
    for name, n in nodes.items():
        if state == "drained":
            if "DRAIN" in n.flags:
                skipped[name] = "already drained" if n.drained else "already draining"
                continue
            predicted[name] = n.but(flags=n.flags | {"DRAIN"}, reason=p["reason"])
        elif state == "down":
            if n.is_down:
                skipped[name] = "already down"
                continue
            predicted[name] = n.but(state="down", reason=p["reason"])
        elif state == "resumed":
            if not n.out_of_service:
                skipped[name] = f"not drained or down ({n.sinfo_state})"
                continue
            if prefix and not n.drained_by(prefix):
                skipped[name] = f"reason {n.reason!r} does not start with {prefix!r}"
                continue
            predicted[name] = n.but(state="idle" if n.is_down else n.state, reason="",
                                    flags=n.flags - {"DRAIN", "FAIL", "NOT_RESPONDING"})
        elif state == "rebooted":
            why = n.foreign(prefix) if prefix else None
            if why:
                skipped[name] = why
                continue
            if n.reboot_pending:
                skipped[name] = "reboot already pending"
                continue
            since = p["skip_if_booted_since"]
            if since is not None and n.boot_time is not None and n.boot_time >= since:
                skipped[name] = f"booted at {n.boot_time}, at or after {since}"
                continue
            extra = {"REBOOT_REQUESTED"} | ({"DRAIN"} if p["asap"] else set())
            predicted[name] = n.but(flags=n.flags | extra, reason=p["reason"] or n.reason)
        targets.append(name)
    return targets, skipped, predicted


def main() -> None:
    argument_spec = dict(
        name=dict(type="str", required=True, aliases=["nodes"]),
        state=dict(type="str", required=True, choices=["drained", "resumed", "down", "rebooted"]),
        reason=dict(type="str"),
        nextstate=dict(type="str", choices=["resume", "down"], default="resume"),
        asap=dict(type="bool", default=True),
        skip_if_booted_since=dict(type="int"),
        only_if_reason_prefix=dict(type="str"),
        wait=dict(type="bool", default=False),
        timeout=dict(type="int", default=300),
        poll_interval=dict(type="float", default=1.0),
    )
    argument_spec.update(SLURM_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    state = p["state"]

    if state in ("drained", "down") and not (p["reason"] or "").strip():
        module.fail_json(msg=f"reason is required when state={state}: Slurm refuses to drain or down a node "
                             "without one, and the reason is how operators and automation know why")
    for key in ("reason", "only_if_reason_prefix"):
        if p[key] and ("\n" in p[key] or "\r" in p[key]):
            module.fail_json(msg=f"{key} must be a single line")
    if p["only_if_reason_prefix"] is not None and state not in ("resumed", "rebooted"):
        module.fail_json(msg="only_if_reason_prefix applies to state=resumed and state=rebooted only")
    if p["timeout"] < 0 or p["poll_interval"] <= 0:
        module.fail_json(msg="timeout must be >= 0 and poll_interval > 0")
    if p["reason"]:
        p["reason"] = p["reason"].strip()

    client = client_from_module(module)
    result: Dict[str, Any] = dict(changed=False, nodes=[], changed_nodes=[], skipped_nodes={}, before={}, after={},
                                  commands=[], waited=0.0, backend="")
    try:
        nodes = client.nodes(p["name"])
        result["backend"] = f"{client.backend} ({client.backend_reason})"
        result["nodes"] = list(nodes)
        result["before"] = {n: node.to_dict() for n, node in nodes.items()}
        targets, skipped, predicted = _plan(nodes, p)
        result["skipped_nodes"] = skipped
        result["changed_nodes"] = targets
        result["changed"] = bool(targets)
        if module.check_mode or not targets:
            after = dict(nodes)
            after.update(predicted)
        else:
            if state == "drained":
                client.drain(targets, p["reason"])
            elif state == "down":
                client.down(targets, p["reason"])
            elif state == "resumed":
                client.resume(targets)
            elif state == "rebooted":
                client.reboot(targets, p["reason"], nextstate=p["nextstate"], asap=p["asap"])
            now = client.nodes(p["name"])
            if p["wait"] and state != "down":
                try:
                    now, result["waited"] = wait_for_nodes(
                        lambda: client.nodes(p["name"]), state, nodes, targets, timeout=p["timeout"],
                        poll_interval=p["poll_interval"], nextstate=p["nextstate"], first=now)
                except WaitTimeout as exc:
                    result["waited"] = exc.waited
                    result["after"] = {n: node.to_dict() for n, node in exc.nodes.items()}
                    result["commands"] = client.commands
                    module.fail_json(msg=exc.msg, **result)
            after = now
        result["after"] = {n: node.to_dict() for n, node in after.items()}
    except SlurmError as exc:
        result["commands"] = client.commands
        fail_slurm(module, exc, **{k: v for k, v in result.items() if k in ("nodes", "before", "commands")})
    except ValueError as exc:
        module.fail_json(msg=str(exc))

    result["commands"] = client.commands
    if module._diff:
        result["diff"] = change("slurm nodes " + ",".join(result["nodes"]),
                                {n: _brief(nodes[n]) for n in result["nodes"]},
                                {n: _brief(after[n]) for n in result["nodes"]})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
