# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Judge the health of a GPU node (passive checks) and report a verdict and an action
version_added: "0.1.0"
description:
  - Probes the NVIDIA GPUs of the target through NVML (C(pynvml) from the C(nvidia-ml-py) package, in a child process
    with a hard deadline), reads the kernel log (C(/dev/kmsg)) for Xid, SXid and fallen-off-the-bus records, and
    asks the gpufleet health rules for a verdict (V(healthy), V(degraded), V(unhealthy), V(unknown)) and the
    strongest recommended action (V(none) < V(monitor) < V(reset_gpu) < V(reboot) < V(reimage) < V(replace)), with
    the evidence for each finding.
  - Instead of live NVML it can replay an C(nvidia-smi -q -x) or C(nvidia-smi -q) capture, a fake NVML
    configuration, and a captured kernel log, so it also runs without a GPU.
  - A probe that times out or cannot start gives V(unknown), never V(healthy).
  - Changes nothing on the node. With O(state_path) the rules keep counters between runs (for rates such as PCIe
    replays per minute) in that small file; it is bookkeeping, not configuration, so C(changed) stays false, and in
    check mode the file is read but not written.
  - The verdict is returned, also as the fact C(gpufleet_health); an unhealthy node does not fail the task.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes.no_diff
options:
  expected_gpus:
    description:
      - Number of GPUs the node must show. Fewer visible GPUs is V(unhealthy) (C(gpu_missing)).
      - When unset, the count the driver reports as attached is the expectation.
      - V(0) declares a CPU node. There, no NVIDIA driver or NVML library is V(healthy) (an info finding
        C(no_gpu_expected)); on any other node it is V(unhealthy) (C(driver_not_loaded), C(nvml_missing)).
    type: int
  thresholds:
    description:
      - Overrides of the rule thresholds, for example C(pcie_replay_per_min_gen5), C(sticky_window_s),
        C(burst_window_s), C(throttle_persist_runs), C(probe_timeout_strikes). Unknown names are an error.
    type: dict
    default: {}
  skip_checks:
    description:
      - Checks to skip, from C(probe), C(gpu_count), C(gpu_lost), C(ecc), C(retired_pages), C(row_remap),
        C(recovery_action), C(temperature), C(clocks), C(power), C(pcie_link), C(pcie_replay), C(nvlink),
        C(persistence), C(fabric), C(driver), C(xid), C(sxid), C(ib), C(mounts), C(disk), C(memory).
    type: list
    elements: str
    default: []
  xid_overrides:
    description:
      - 'Site overrides of the Xid catalog per Xid code, e.g. C({"94": {"action": "none", "severity": "info"}}).'
      - Keys per code are C(name), C(bucket), C(investigatory), C(severity), C(action), C(sticky).
    type: dict
    default: {}
  expected_driver:
    description:
      - NVIDIA driver version the node must run; another version is V(degraded) with action V(reimage).
    type: str
  nvidia_smi_xml:
    description:
      - Path on the target of an C(nvidia-smi -q -x) capture to judge instead of probing NVML.
      - Mutually exclusive with O(nvidia_smi_text) and O(fake_nvml).
    type: path
  nvidia_smi_text:
    description:
      - Path on the target of a plain-text C(nvidia-smi -q) capture (or nvidia-smi / NVML error text) to judge.
    type: path
  fake_nvml:
    description:
      - Path on the target of a fake NVML configuration (JSON, or YAML when PyYAML is installed) to probe instead of
        the real driver. The probe code is the same as for live NVML; errors are C(pynvml)'s real C(NVMLError_*)
        classes, so C(nvidia-ml-py) must be installed.
    type: path
  kmsg_path:
    description:
      - Path on the target of a captured kernel log (dmesg, journalctl -k, /dev/kmsg dump) to read instead of
        C(/dev/kmsg). Kernel events in a capture are judged as of its newest dated line.
      - V(-) reads no kernel log.
    type: str
  state_path:
    description:
      - File that carries counters and remembered severe kernel events between runs (written atomically, mode 0600).
        Without it every run judges one snapshot alone and counter rates are not evaluated.
    type: path
  repaired_at:
    description:
      - Epoch seconds when a repair step (GPU reset, reboot) started that this check verifies. Kernel events dated at
        or before it are what the step fixed - still in the kernel log after a GPU reset - and are neither judged
        nor, with O(state_path), remembered; the state file keeps the time, so the node's agent reading the same
        file forgets them too. Events after it still count.
    type: float
    version_added: "0.4.0"
  probe_deadline:
    description:
      - Seconds the NVML probe may take before it is abandoned and the verdict is V(unknown).
    type: float
    default: 20.0
  required_mounts:
    description:
      - Mount points the node must have (for example C(/home), C(/scratch)); a missing one is V(unhealthy) with
        action V(reboot). Checked on live probes.
    type: list
    elements: str
    default: []
  disk_paths:
    description:
      - File systems whose free space is checked on live probes (below 5 % free is V(degraded)).
    type: list
    elements: path
    default: ["/", "/tmp"]
requirements:
  - nvidia-ml-py (pynvml) on the target for live probes and for O(fake_nvml)
notes:
  - Reading C(/dev/kmsg) needs root (or CAP_SYSLOG). When it cannot be read the module warns and judges without it.
"""

EXAMPLES = r"""
- name: Judge the GPUs of every node
  gpufleet.reliability.gpu_health:
    expected_gpus: 8
    state_path: /var/lib/gpufleet/health-state.json
  register: health

- name: Show unhealthy nodes
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }}: {{ health.summary }}"
  when: health.verdict == 'unhealthy'

- name: Replay a support-bundle capture without a GPU
  gpufleet.reliability.gpu_health:
    nvidia_smi_xml: /tmp/bundle/nvidia-smi-q-x.xml
    kmsg_path: /tmp/bundle/dmesg.log
    skip_checks: [persistence]
"""

RETURN = r"""
verdict:
  description: V(healthy), V(degraded), V(unhealthy) or V(unknown).
  returned: always
  type: str
  sample: unhealthy
action:
  description: The strongest action of the findings (none, monitor, reset_gpu, reboot, reimage, replace).
  returned: always
  type: str
  sample: reboot
code:
  description: Short code of the worst finding (V(ok) when there is none).
  returned: always
  type: str
  sample: xid79
gpu:
  description: GPU index of the worst finding, or null.
  returned: always
  type: int
  sample: 3
drain:
  description:
    - True when a finding asks for the node to be taken out of service although no automatic repair applies
      (a node-level power brake or HW slowdown on every GPU; verdict V(degraded), action V(monitor)). The node
      agent drains for it and the repair plan holds the node for a person.
  returned: always
  type: bool
  sample: false
summary:
  description: One line for humans.
  returned: always
  type: str
  sample: "unhealthy: xid79 on gpu 3 (Xid 79 GPU has fallen off the bus (1 burst, 1 line)) -> reboot"
findings:
  description: Every finding, each with check, severity (info, warning, critical, unknown), gpu, pci, detail,
    evidence (list of strings), action and code.
  returned: always
  type: list
  elements: dict
  sample: [{"check": "xid", "severity": "critical", "gpu": 3, "pci": "0000:53:00", "code": "xid79",
            "action": "reboot", "detail": "Xid 79 GPU has fallen off the bus (1 burst, 1 line)",
            "evidence": ["[ 1843.3] NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus"]}]
drain_reason:
  description: The Slurm reason the node agent would use to drain this node.
  returned: always
  type: str
  sample: "gpufleet: xid79 gpu3"
probe:
  description: Where the snapshot came from and how the probe went (source, status, error, gpus).
  returned: always
  type: dict
  sample: {"source": "nvml", "status": "ok", "error": null, "gpus": 8}
ansible_facts:
  description: Facts set by the module.
  returned: always
  type: complex
  contains:
    gpufleet_health:
      description: The report (verdict, action, code, gpu, summary, findings) plus checked_at and catalog_version.
      returned: always
      type: dict
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.reliability.plugins.module_utils import kmsg as kmsg_adapter
from ansible_collections.gpufleet.reliability.plugins.module_utils import nodeinfo, nvml
from ansible_collections.gpufleet.reliability.plugins.module_utils.health import (
    CATALOG_VERSION,
    judge,
    read_nvidia_smi_text,
    read_nvidia_smi_xml,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.health.model import PROBE_FAILED, Snapshot
from ansible_collections.gpufleet.reliability.plugins.module_utils.statefile import load_state, save_state


def _read(module, path, option):
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError as exc:
        module.fail_json(msg=f"{option}: cannot read {path}: {exc.strerror}")


def _snapshot(module):
    p = module.params
    if p["nvidia_smi_xml"]:
        return read_nvidia_smi_xml(_read(module, p["nvidia_smi_xml"], "nvidia_smi_xml"))
    if p["nvidia_smi_text"]:
        return read_nvidia_smi_text(_read(module, p["nvidia_smi_text"], "nvidia_smi_text"))
    if p["fake_nvml"] and not nvml.HAS_PYNVML:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=nvml.PYNVML_IMPORT_ERROR)
    if p["probe_deadline"] <= 0:
        module.fail_json(msg=f"probe_deadline: expected a number of seconds > 0, got {p['probe_deadline']}")
    try:
        snap = nvml.probe_with_deadline(p["probe_deadline"], fake_nvml=p["fake_nvml"])
    except (OSError, ValueError) as exc:
        if p["fake_nvml"]:
            module.fail_json(msg=f"fake_nvml {p['fake_nvml']}: {exc}")
        snap = Snapshot(source="nvml", probe_status=PROBE_FAILED, probe_error=str(exc))
    if not p["fake_nvml"]:
        nodeinfo.fill(snap, disk_paths=p["disk_paths"])
    return snap


def main():
    module = AnsibleModule(
        argument_spec=dict(
            expected_gpus=dict(type="int"),
            thresholds=dict(type="dict", default={}),
            skip_checks=dict(type="list", elements="str", default=[]),
            xid_overrides=dict(type="dict", default={}),
            expected_driver=dict(type="str"),
            nvidia_smi_xml=dict(type="path"),
            nvidia_smi_text=dict(type="path"),
            fake_nvml=dict(type="path"),
            kmsg_path=dict(type="str"),
            state_path=dict(type="path"),
            repaired_at=dict(type="float"),
            probe_deadline=dict(type="float", default=20.0),
            required_mounts=dict(type="list", elements="str", default=[]),
            disk_paths=dict(type="list", elements="path", default=["/", "/tmp"]),
        ),
        mutually_exclusive=[("nvidia_smi_xml", "nvidia_smi_text", "fake_nvml")],
        supports_check_mode=True,
    )
    p = module.params
    cfg = {"thresholds": p["thresholds"], "skip_checks": p["skip_checks"], "xid_overrides": p["xid_overrides"]}
    if p["expected_gpus"] is not None:
        cfg["expected_gpus"] = p["expected_gpus"]
    if p["expected_driver"]:
        cfg["expected_driver"] = p["expected_driver"]
    if p["required_mounts"]:
        cfg["required_mounts"] = p["required_mounts"]

    snap = _snapshot(module)
    state = load_state(p["state_path"]) if p["state_path"] else {}
    cursor = None
    lines = []
    kp = p["kmsg_path"]
    if kp == "-":
        pass
    elif kp:
        lines = _read(module, kp, "kmsg_path")
        cfg["events_as_of"] = "latest"
    else:
        try:
            lines, cursor = kmsg_adapter.live_events(state.get("kmsg_cursor"))
        except OSError as exc:
            module.warn(f"kernel log not read (/dev/kmsg: {exc.strerror or exc}); judging without it")
    try:
        report = judge(snap, lines, config=cfg, state=state, repaired_at=p["repaired_at"], now=time.time())
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    if p["state_path"] and not module.check_mode:
        new_state = dict(report.state or {})
        new_state["kmsg_cursor"] = cursor if cursor is not None else state.get("kmsg_cursor")
        try:
            save_state(p["state_path"], new_state)
        except OSError as exc:
            module.fail_json(msg=f"state_path: cannot write {p['state_path']}: {exc.strerror or exc}")
    d = report.to_dict()
    probe = {"source": snap.source, "status": snap.probe_status, "error": snap.probe_error, "gpus": len(snap.gpus)}
    fact = dict(d, checked_at=report.checked_at, catalog_version=CATALOG_VERSION, probe=probe,
                node=os.uname().nodename)
    module.exit_json(changed=False, drain_reason=report.drain_reason(), probe=probe,
                     ansible_facts={"gpufleet_health": json.loads(json.dumps(fact))}, **d)


if __name__ == "__main__":
    main()
