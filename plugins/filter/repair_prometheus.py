# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter repair_prometheus: the repair run's Prometheus textfile (the brain's health.metrics.repair_text)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: repair_prometheus
short_description: Prometheus text for one repair run
description:
  - Renders what one run of the repair playbook planned and did as Prometheus text for node_exporter's textfile
    collector (C(gpufleet_repair.prom)) - breaker open, decisions by action, steps waiting for approval, escalated
    nodes, steps by action and outcome, failed steps, the run's time. The alert rules in C(monitoring/) read it.
  - Anything that is not the expected shape counts as absent; the text always passes C(promtool check metrics).
author:
  - gpufleet.reliability contributors (@gpufleet)
positional: breaker, results, now
options:
  _input:
    description:
      - The plan returned by M(gpufleet.reliability.repair_plan) (its RV(gpufleet.reliability.repair_plan#module:plan)).
    type: dict
    required: true
  breaker:
    description: The breaker state returned by M(gpufleet.reliability.repair_plan).
    type: dict
  results:
    description: The step results of the run (C(node), C(action), C(failed)).
    type: list
    elements: dict
  now:
    description: Unix time of the run; omitted means no timestamp series.
    type: float
"""

EXAMPLES = r"""
- name: Write the repair metrics for node_exporter
  ansible.builtin.copy:
    content: >-
      {{ node_repair_plan.plan | gpufleet.reliability.repair_prometheus(node_repair_plan.breaker,
         node_repair_results, now(utc=true).timestamp()) }}
    dest: /var/lib/prometheus/node-exporter/gpufleet_repair.prom
    mode: "0644"
"""

RETURN = r"""
_value:
  description: The text, one C(# HELP)/C(# TYPE) block per metric, newline-terminated.
  type: string
"""

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.metrics import repair_text


def repair_prometheus(plan, breaker=None, results=None, now=None):
    return repair_text(plan, breaker, results, None if now is None else float(now))


class FilterModule:
    def filters(self):
        return {"repair_prometheus": repair_prometheus}
