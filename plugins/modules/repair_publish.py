# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: repair_publish
short_description: Publish what one repair run did - results, summary, metrics - and free its run lock
version_added: "0.4.0"
description:
  - The last step of a run of the C(gpufleet.reliability.node_repair) role, in one module run on the controller
    (not one C(ansible.builtin.copy) per file, each a round trip of its own).
  - Writes the step results and the run's summary to O(publish_dir) as C(result.json) and C(summary.json), and the
    run's metrics for node_exporter's textfile collector to O(textfile_dir) as C(gpufleet_repair.prom) (what the
    alert rules in C(monitoring/) read; the text of the C(gpufleet.reliability.repair_prometheus) filter).
  - Each file is replaced atomically (a temporary file in the same directory, then a rename) and only when its
    content differs; node_exporter never reads a half-written file.
  - "With O(plan), also writes C(followup.json) to O(publish_dir), C({\"nodes\": {node: epoch second}}): when the
    event loop should run again for a node without a new alert (a step that did not give the node back, a wait of
    the policy's own; the rule is C(repair.followups)). The C(gpufleet.reliability.alert_webhook) event source reads
    it (C(followup.json) in O(publish_dir) as its C(followup_file))."
  - Then frees the run lock O(lock_file) when this run holds it (a lock another run holds is left alone).
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes.no_diff
options:
  publish_dir:
    description:
      - An existing directory for C(result.json) and C(summary.json). Unset - not written.
    type: path
  results:
    description:
      - The step results of the run (C(node), C(action), C(failed), ...).
    type: list
    elements: dict
    default: []
  summary:
    description:
      - The run's summary (headline, lines, problems).
    type: dict
    default: {}
  textfile_dir:
    description:
      - An existing directory of node_exporter's textfile collector for C(gpufleet_repair.prom). Unset - not
        written.
    type: path
  plan:
    description:
      - The plan returned by M(gpufleet.reliability.repair_plan) (its RV(gpufleet.reliability.repair_plan#module:plan)),
        for the metrics.
    type: dict
  breaker:
    description:
      - The breaker state returned by M(gpufleet.reliability.repair_plan), for the metrics.
    type: dict
  now:
    description:
      - Unix time of the run for the metrics' timestamp. Default the controller's clock.
    type: float
  mode:
    description:
      - The permission bits of the files written, as an octal string.
    type: str
    default: "0644"
  lock_file:
    description:
      - The run lock taken by M(gpufleet.reliability.repair_plan), freed when this run holds it. Not freed in
        check mode (a check run takes none).
    type: path
seealso:
  - module: gpufleet.reliability.repair_plan
"""

EXAMPLES = r"""
- name: Publish the run and free its lock
  gpufleet.reliability.repair_publish:
    publish_dir: /var/lib/gpufleet/repair/last-run
    results: "{{ node_repair_results }}"
    summary: "{{ node_repair_summary }}"
    textfile_dir: /var/lib/prometheus/node-exporter
    plan: "{{ node_repair_plan.plan }}"
    breaker: "{{ node_repair_plan.breaker }}"
    lock_file: /var/lib/gpufleet/repair/repair.lock
"""

RETURN = r"""
written:
  description: The files written (or, in check mode, that would be written).
  returned: always
  type: list
  elements: str
lock_freed:
  description: Whether this run's lock was freed.
  returned: always
  type: bool
followup:
  description: When to run again for each node without a new alert (epoch seconds); empty without O(plan).
  returned: always
  type: dict
  sample: {"node17": 1767571260}
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write, differs
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.metrics import repair_text
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.policy import followups
from ansible_collections.gpufleet.reliability.plugins.module_utils.runlock import release


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            publish_dir=dict(type="path"),
            results=dict(type="list", elements="dict", default=[]),
            summary=dict(type="dict", default={}),
            textfile_dir=dict(type="path"),
            plan=dict(type="dict"),
            breaker=dict(type="dict"),
            now=dict(type="float"),
            mode=dict(type="str", default="0644"),
            lock_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        mode = int(str(p["mode"]), 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        module.fail_json(msg=f"mode: expected an octal mode such as 0644, got {p['mode']!r}")
    files = {}
    now = p["now"] if p["now"] is not None else time.time()
    follow = followups((p["plan"] or {}).get("decisions") or [], p["results"], now) if p["plan"] else {}
    if p["publish_dir"]:
        files[os.path.join(p["publish_dir"], "result.json")] = json.dumps(p["results"], indent=4, sort_keys=True)
        files[os.path.join(p["publish_dir"], "summary.json")] = json.dumps(p["summary"], indent=4, sort_keys=True)
        if p["plan"]:
            files[os.path.join(p["publish_dir"], "followup.json")] = json.dumps({"nodes": follow}, sort_keys=True)
    if p["textfile_dir"]:
        files[os.path.join(p["textfile_dir"], "gpufleet_repair.prom")] = repair_text(
            p["plan"] or {}, p["breaker"], p["results"], now).rstrip("\n")
    for key in ("publish_dir", "textfile_dir"):
        if p[key] and not os.path.isdir(p[key]):
            module.fail_json(msg=f"{key}: expected an existing directory, got {p[key]}")

    written = [path for path, text in files.items() if differs(path, text + "\n")]
    if not module.check_mode:
        for path in written:
            try:
                atomic_write(path, files[path] + "\n", mode)
            except OSError as exc:
                module.fail_json(msg=f"cannot write {path}: {exc}", written=written[:written.index(path)])
    freed = False
    if p["lock_file"] and not module.check_mode:
        try:
            freed = release(p["lock_file"])
        except OSError as exc:
            module.fail_json(msg=f"lock_file: cannot free the run lock {p['lock_file']}: {exc}", written=written)
    # freeing our own lock is the end of the run, not a change to report
    module.exit_json(changed=bool(written), written=written, lock_freed=freed, followup=follow)


if __name__ == "__main__":
    main()
