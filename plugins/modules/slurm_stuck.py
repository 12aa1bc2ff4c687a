#!/usr/bin/python
# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_stuck
short_description: Find Slurm nodes stuck in COMPLETING or with unkillable job steps, and optionally drain them
version_added: "0.1.0"
description:
  - Reports nodes whose jobs have been COMPLETING for longer than O(completing_after) seconds (the job ended but
    its processes or its epilog have not finished, for example a hung epilog, a process in uninterruptible sleep
    on a dead GPU or file system), and nodes whose reason says a job step could not be killed (slurmstepd drains a node
    with C(Kill task failed) when a step outlives C(UnkillableStepTimeout)).
  - With O(drain=true), drains the stuck-completing nodes that are not drained yet, in one
    C(scontrol update NodeName=<hostlist>), so that no new job lands on them. Nodes Slurm already drained for an
    unkillable step keep their reason.
  - The age of a COMPLETING job is now minus the job's end time as C(squeue) reports it.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
  - gpufleet.reliability.slurm
options:
  name:
    description:
      - Only these nodes (node name or hostlist expression); all nodes when not given.
    type: str
    aliases: [nodes]
  completing_after:
    description:
      - Seconds a job may stay COMPLETING before its node counts as stuck.
    type: int
    default: 600
  unkillable_reasons:
    description:
      - Reason prefixes that mean a job step could not be killed.
    type: list
    elements: str
    default: ["Kill task failed"]
  drain:
    description:
      - Drain the stuck-completing nodes that are not drained yet.
    type: bool
    default: false
  reason:
    description:
      - Drain reason (one C(scontrol update) for all the nodes). The job ids and ages are in RV(stuck).
    type: str
    default: "gpufleet: stuck completing"
seealso:
  - module: gpufleet.reliability.slurm_node
  - name: UnkillableStepTimeout in slurm.conf(5)
    description: After this long, slurmstepd gives up killing a step and drains the node.
    link: https://slurm.schedmd.com/slurm.conf.html#OPT_UnkillableStepTimeout
"""

EXAMPLES = r"""
- name: Report nodes stuck in COMPLETING for more than 10 minutes, and drain them
  gpufleet.reliability.slurm_stuck:
    completing_after: 600
    drain: true
  register: stuck

- name: Reboot what is stuck
  gpufleet.reliability.slurm_node:
    name: "{{ stuck.stuck | map(attribute='node') | join(',') }}"
    state: rebooted
    reason: "gpufleet: stuck completing"
  when: stuck.stuck | length > 0
"""

RETURN = r"""
stuck:
  description: One entry per stuck node.
  returned: always
  type: list
  elements: dict
  contains:
    node:
      description: Node name.
      type: str
    kind:
      description: V(completing) (jobs COMPLETING too long) or V(unkillable) (a step could not be killed).
      type: str
    seconds:
      description: How long the oldest COMPLETING job on the node has been completing (null for unkillable).
      type: int
    jobs:
      description: The COMPLETING job ids on the node.
      type: list
      elements: str
    state:
      description: The node's state as C(sinfo -o %T) prints it.
      type: str
    reason:
      description: The node's reason.
      type: str
  sample: [{node: node3, kind: completing, seconds: 742, jobs: ["11"], state: completing, reason: ""}]
completing:
  description: Every node in COMPLETING now with the age in seconds of its oldest COMPLETING job (null when none
    was found), stuck or not.
  returned: always
  type: dict
  sample: {node3: 742}
drained:
  description: Nodes drained by this task (in check mode, that would be).
  returned: always
  type: list
  elements: str
commands:
  description: The Slurm commands run.
  returned: always
  type: list
  elements: list
"""

import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.diff import change
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node, SlurmError
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm_module import (
    SLURM_COMMON_ARGS,
    client_from_module,
    fail_slurm,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import REASON_PREFIX


def find_stuck(nodes: Mapping[str, Node], jobs_by_node: Mapping[str, List[Dict[str, Any]]], now: float,
               completing_after: float, unkillable_reasons: Sequence[str]
               ) -> Tuple[List[Dict[str, Any]], Dict[str, Optional[int]]]:
    """-> (stuck entries, {node: age or None} for every COMPLETING node). Pure: unit-testable."""
    stuck: List[Dict[str, Any]] = []
    completing: Dict[str, Optional[int]] = {}
    for name, node in nodes.items():
        if node.out_of_service and any(p and (node.reason or "").startswith(p) for p in unkillable_reasons):
            stuck.append({"node": name, "kind": "unkillable", "seconds": None,
                          "jobs": [j["job_id"] for j in jobs_by_node.get(name, [])],
                          "state": node.sinfo_state, "reason": node.reason})
            continue
        if "COMPLETING" not in node.flags:
            continue
        jobs = jobs_by_node.get(name, [])
        ages = [int(now - j["end_time"]) for j in jobs if j.get("end_time")]
        age = max(ages) if ages else None
        completing[name] = age
        if age is not None and age >= completing_after:
            stuck.append({"node": name, "kind": "completing", "seconds": age, "jobs": [j["job_id"] for j in jobs],
                          "state": node.sinfo_state, "reason": node.reason})
    return stuck, completing


def main() -> None:
    argument_spec = dict(
        name=dict(type="str", aliases=["nodes"]),
        completing_after=dict(type="int", default=600),
        unkillable_reasons=dict(type="list", elements="str", default=["Kill task failed"]),
        drain=dict(type="bool", default=False),
        reason=dict(type="str", default=f"{REASON_PREFIX} stuck completing"),
    )
    argument_spec.update(SLURM_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    if p["completing_after"] < 0:
        module.fail_json(msg="completing_after must be >= 0 seconds")
    if not p["reason"].strip() or "\n" in p["reason"]:
        module.fail_json(msg="reason must be a non-empty single line")

    client = client_from_module(module)
    result: Dict[str, Any] = dict(changed=False, stuck=[], completing={}, drained=[], commands=[])
    try:
        nodes = client.nodes(p["name"]) if p["name"] else client.nodes()
        jobs_by_node: Dict[str, List[Dict[str, Any]]] = {}
        if any("COMPLETING" in n.flags for n in nodes.values()) or p["unkillable_reasons"]:
            for job in client.jobs(states=["CG"]):
                for n in client.expand_hostlist(job["nodes"]) if job["nodes"] else []:
                    jobs_by_node.setdefault(n, []).append(job)
        stuck, completing = find_stuck(nodes, jobs_by_node, time.time(), p["completing_after"],
                                       p["unkillable_reasons"])
        result["stuck"], result["completing"] = stuck, completing
        to_drain = [s for s in stuck if s["kind"] == "completing" and "DRAIN" not in nodes[s["node"]].flags]
        if p["drain"] and to_drain:
            result["drained"] = [s["node"] for s in to_drain]
            result["changed"] = True
            if not module.check_mode:
                client.drain(result["drained"], p["reason"].strip())
            if module._diff:
                result["diff"] = change("slurm nodes " + ",".join(result["drained"]),
                                        {n: {"flags": sorted(nodes[n].flags)} for n in result["drained"]},
                                        {n: {"flags": sorted(nodes[n].flags | {"DRAIN"})} for n in result["drained"]})
    except SlurmError as exc:
        result["commands"] = client.commands
        fail_slurm(module, exc, commands=client.commands)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    result["commands"] = client.commands
    module.exit_json(**result)


if __name__ == "__main__":
    main()
