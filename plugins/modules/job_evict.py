# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_evict
short_description: Evict the jobs of a node the repair policy drained (checkpoint signal, grace, requeue)
version_added: "0.2.0"
description:
  - Carries out the job part of an C(evict) decision of C(gpufleet.reliability.repair_plan) (its C(jobs) field)
    for one node, through the collection's Slurm adapter. The decision is the policy's; this module only does it.
  - The node must be out of service by us (its reason starts with O(reason_prefix)); a node that is not ours, or
    in service, is never touched (the module fails).
  - O(phase=signal) sends O(signal) to each job of O(jobs) that still runs on the node (C(scancel --signal), to
    O(signal_to)), waits up to O(grace) seconds for each to leave the node, then requeues (C(scontrol requeue))
    each job the policy's rule says to requeue - one still on the node (it ignored the signal), or one that ended
    in any state but C(COMPLETED) (it checkpointed and exited, or the signal ended it). A job that is queued again
    (it requeued itself) or runs elsewhere is left alone; a job that ended C(COMPLETED) finished its work.
  - O(phase=requeue) requeues at once, by the same rule, without a signal.
  - Slurm gives a requeued job a begin time about two minutes away once its requeue has finished (its processes
    ended, its epilogs ran); the hot spare is already in service when this runs, so the module waits (up to two
    minutes) for each requeued job to be pending with its begin time in the future (C(squeue -O EligibleTime)) and
    sets its start time to now (C(scontrol update JobId=... StartTime=now)), again if Slurm sets the begin time
    again. Never within two seconds of the requeue, as a node refuses a launch credential made in the second the
    job's old one was revoked in, and the job would end C(FAILED). A job still held back after that is a
    warning; it starts when Slurm's delay ends.
  - In check mode nothing is signalled or requeued; the result says what would be.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
  - gpufleet.reliability.slurm
options:
  node:
    description: The node the jobs are evicted from.
    type: str
    required: true
  jobs:
    description: Slurm job ids (C(123) or C(123_4)), from the decision's C(jobs.job_ids).
    type: list
    elements: str
    required: true
  phase:
    description: V(signal) to signal, wait and requeue; V(requeue) to requeue at once.
    type: str
    choices: [signal, requeue]
    required: true
  signal:
    description: The signal name (without C(SIG)) for O(phase=signal).
    type: str
    default: USR1
  signal_to:
    description: Whom the signal reaches - V(steps) (the job steps' tasks, C(scancel)'s default), V(batch) (the
      batch shell only, C(--batch)) or V(full) (both, C(--full)).
    type: str
    choices: [steps, batch, full]
    default: steps
  grace:
    description: Seconds each job has, after the signal, to checkpoint and leave the node.
    type: float
    default: 600
  poll:
    description: Seconds between looks at the jobs while they have time to leave.
    type: float
    default: 5
  reason_prefix:
    description: Our reasons start with this; only a node out of service with such a reason is acted on.
    type: str
    default: "gpufleet:"
  scontrol:
    description: Path or name of C(scontrol).
    type: str
    default: scontrol
  sinfo:
    description: Path or name of C(sinfo).
    type: str
    default: sinfo
  squeue:
    description: Path or name of C(squeue).
    type: str
    default: squeue
  scancel:
    description: Path or name of C(scancel).
    type: str
    default: scancel
seealso:
  - module: gpufleet.reliability.repair_plan
  - module: gpufleet.reliability.repair_step
"""

EXAMPLES = r"""
- name: Evict the jobs of a drained node as the plan decided
  gpufleet.reliability.job_evict:
    node: "{{ decision.node }}"
    jobs: "{{ decision.jobs.job_ids }}"
    phase: "{{ decision.jobs.phase }}"
    signal: "{{ decision.jobs.signal }}"
    signal_to: "{{ decision.jobs.signal_to }}"
    grace: "{{ decision.jobs.grace }}"
"""

RETURN = r"""
jobs:
  description: What became of each job - C(requeued), C(requeued itself) (queued again by itself), C(elsewhere)
    (runs on other nodes), C(completed) (finished its work), C(gone) (Slurm no longer knows it), or with check
    mode C(would requeue) / C(would signal).
  returned: always
  type: dict
signalled:
  description: The jobs that were sent the signal.
  returned: always
  type: list
  elements: str
left_after:
  description: Seconds from the signal until the last signalled job left the node (null when one never left, or
    with O(phase=requeue)).
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.rules import requeue_after_eviction
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import SlurmError
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm_module import (
    SLURM_COMMON_ARGS,
    client_from_module,
    fail_slurm,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmfacts import (
    JOB_ACTIVE_STATES,
    JOB_QUEUED_STATES,
    REASON_PREFIX,
    is_job_id,
)

#: Seconds to wait for a requeued job to be pending for its begin time (Slurm's requeue delay is 120 s by default:
#: past that the wait gains nothing), and between two requests to bring its start forward.
START_WAIT = 120
START_AGAIN = 5
#: Seconds after the requeue before its start is brought forward: a Slurm node refuses a launch credential made in
#: or before the second the job's old credential was revoked in (slurmd's cred_revoked()).
REVOKED_FOR = 2


def main() -> None:
    argument_spec = dict(
        node=dict(type="str", required=True),
        jobs=dict(type="list", elements="str", required=True),
        phase=dict(type="str", choices=["signal", "requeue"], required=True),
        signal=dict(type="str", default="USR1"),
        signal_to=dict(type="str", choices=["steps", "batch", "full"], default="steps"),
        grace=dict(type="float", default=600),
        poll=dict(type="float", default=5),
        reason_prefix=dict(type="str", default=REASON_PREFIX),
        scontrol=dict(type="str", default="scontrol"),
        sinfo=dict(type="str", default="sinfo"),
        squeue=dict(type="str", default="squeue"),
        scancel=dict(type="str", default="scancel"),
    )
    argument_spec.update(SLURM_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    name, ids = p["node"], p["jobs"]
    bad = [j for j in ids if not is_job_id(j)]
    if bad or not ids:
        module.fail_json(msg=f"jobs: expected Slurm job ids (123 or 123_4), got {bad or ids!r}")
    if p["grace"] < 0 or p["poll"] <= 0:
        module.fail_json(msg=f"grace: expected seconds >= 0 and poll: seconds > 0, got {p['grace']}, {p['poll']}")
    client = client_from_module(module)
    client.scancel = p["scancel"]
    try:
        node = client.node(name)
    except SlurmError as exc:
        fail_slurm(module, exc)
    if not node.drained_by(p["reason_prefix"]):
        why = node.foreign(p["reason_prefix"]) or "in service"
        module.fail_json(msg=f"node {name} is not out of service by us ({why}); its jobs are never evicted")

    def look() -> dict:
        try:
            return {j["job_id"]: j for j in client.node_jobs(name, ids)}
        except (SlurmError, ValueError) as exc:
            fail_slurm(module, exc, jobs=result, signalled=signalled)

    result: dict = {}
    signalled: list = []
    requeued: list = []
    requeued_at: dict = {}
    left_after = None
    jobs = look()
    if p["phase"] == "signal":
        on = [j for j in ids if j in jobs and jobs[j]["on_node"]]
        for jid in on:
            if module.check_mode:
                result[jid] = "would signal"
                continue
            try:
                client.signal_job(jid, p["signal"], p["signal_to"])
            except SlurmError as exc:
                if "Invalid job id" not in str(exc):  # the job ended meanwhile: nothing to signal
                    fail_slurm(module, exc, jobs=result, signalled=signalled)
            signalled.append(jid)
        t0 = time.monotonic()
        while signalled and not module.check_mode:
            jobs = look()
            if not any(jobs.get(j, {}).get("on_node") for j in signalled):
                left_after = round(time.monotonic() - t0, 1)
                break
            if time.monotonic() - t0 >= p["grace"]:
                break
            time.sleep(min(p["poll"], max(0.1, p["grace"] - (time.monotonic() - t0))))
    for jid in ids:
        j = jobs.get(jid)
        if jid in result:
            continue  # check mode: would signal
        if j is None:
            result[jid] = "gone"
        elif requeue_after_eviction(j["state"], j["on_node"]):
            if module.check_mode:
                result[jid] = "would requeue"
                continue
            try:
                requeued_at[jid] = time.time()
                client.requeue(jid)
            except SlurmError as exc:
                fail_slurm(module, exc, jobs=result, signalled=signalled)
            result[jid] = "requeued"
            requeued.append(jid)
        elif j["state"] in JOB_QUEUED_STATES:
            result[jid] = "requeued itself"
        elif j["state"] in JOB_ACTIVE_STATES:
            result[jid] = "elsewhere"
        else:
            result[jid] = "completed"
    # Slurm holds a requeued job back: its begin time is about two minutes on, set when the job is pending again -
    # at once for a job that had ended, after its processes ended and its epilogs ran for one that still ran (longer
    # on a busy node). The spare is already in, so the job may start at once: while it is pending with a begin time
    # in the future, bring its start forward; a begin time set again by a requeue that finished after that is
    # brought forward again. Done when it may start now (it waits for nodes or its priority), runs, or has left.
    # Never in the second of the requeue or the one after: a node refuses a launch credential made no later than
    # the second its old one was revoked in (the requeue's kill), and the launch fails, ending the job FAILED.
    t0 = time.monotonic()
    asked: dict = {}
    while requeued and time.monotonic() - t0 < START_WAIT:
        jobs = look()
        for jid in list(requeued):
            j = jobs.get(jid)
            if j is not None and j["state"] == "COMPLETING":
                continue  # still finishing its requeue
            if j is None or j["state"] not in JOB_QUEUED_STATES or (j["eligible"] or 0) <= time.time():
                requeued.remove(jid)
                continue
            if time.time() < requeued_at[jid] + REVOKED_FOR:
                continue
            if time.monotonic() - asked.get(jid, -START_AGAIN) >= START_AGAIN:
                asked[jid] = time.monotonic()
                try:
                    client.start_now(jid)
                except SlurmError as exc:
                    module.warn(f"job {jid}: requeued, but its start could not be brought forward: {exc}")
                    requeued.remove(jid)
        if requeued:
            time.sleep(0.5)
    for jid in requeued:
        module.warn(f"job {jid}: requeued, but Slurm still holds it back (its requeue delay) after {START_WAIT} s; "
                    "it starts when the delay ends")
    changed = bool(signalled) or any(v in ("requeued", "would requeue", "would signal") for v in result.values())
    module.exit_json(changed=changed, jobs=result, signalled=signalled, left_after=left_after)


if __name__ == "__main__":
    main()
