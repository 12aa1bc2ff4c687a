# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_reset
short_description: Reset one NVIDIA GPU, refusing while processes hold it
version_added: "0.1.0"
description:
  - Resets one GPU with C(nvidia-smi -r -i <index>) - the step of the repair ladder between draining a node and
    rebooting it.
  - Refuses (fails, changes nothing) while any compute process holds the GPU, as listed by
    C(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader -i <index>). Drain the node first.
  - NVML has no public reset call, so the reset always goes through C(nvidia-smi); O(nvidia_smi) can name a stand-in
    (tests use a fake one).
  - Optionally turns persistence mode off first (some drivers refuse to reset a GPU in persistence mode) and back
    on after.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes.no_diff
attributes:
  check_mode:
    details: Checks for processes and reports what it would do; resets nothing.
options:
  gpu:
    description:
      - Index of the GPU to reset (as C(nvidia-smi -i) takes it). Omitted means every GPU of the node
        (C(nvidia-smi -r) without C(-i)), which needs every GPU to be free.
    type: int
  nvidia_smi:
    description:
      - Path or name of C(nvidia-smi).
    type: path
    default: nvidia-smi
  toggle_persistence:
    description:
      - Turn persistence mode off before the reset and on again after it.
    type: bool
    default: false
  timeout:
    description:
      - Seconds each C(nvidia-smi) call may take before it counts as hung.
    type: int
    default: 120
"""

EXAMPLES = r"""
- name: Reset GPU 3 of a drained node
  gpufleet.reliability.gpu_reset:
    gpu: 3
  become: true
"""

RETURN = r"""
gpu:
  description: The GPU index (null for all GPUs).
  returned: always
  type: int
processes:
  description: Compute processes found on the GPU (pid, name). A non-empty list means the module refused.
  returned: always
  type: list
  elements: dict
stdout:
  description: Output of the reset command.
  returned: when the reset ran
  type: str
"""

from ansible.module_utils.basic import AnsibleModule


def _processes(out):
    procs = []
    for line in (out or "").splitlines():
        line = line.strip()
        if not line or line.lower().startswith("no running") or line.startswith("pid"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0].isdigit():
            procs.append({"pid": int(parts[0]), "name": parts[1] if len(parts) > 1 else ""})
    return procs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpu=dict(type="int"),
            nvidia_smi=dict(type="path", default="nvidia-smi"),
            toggle_persistence=dict(type="bool", default=False),
            timeout=dict(type="int", default=120),
        ),
        supports_check_mode=True,
    )
    p = module.params
    gpu = p["gpu"]
    if gpu is not None and gpu < 0:
        module.fail_json(msg=f"gpu: expected a GPU index >= 0, got {gpu}")
    sel = ["-i", str(gpu)] if gpu is not None else []
    what = f"GPU {gpu}" if gpu is not None else "all GPUs"
    smi = p["nvidia_smi"]
    if "/" not in smi:
        found = module.get_bin_path(smi)
        if not found:
            module.fail_json(msg=f"nvidia_smi: {smi} not found on PATH")
        smi = found

    def run(*args):
        # timeout(1) guards against nvidia-smi hanging on a wedged GPU
        argv = [smi, *args]
        timeout_bin = module.get_bin_path("timeout")
        if timeout_bin:
            argv = [timeout_bin, "-k", "5", str(p["timeout"]), *argv]
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    rc, out, err = run("--query-compute-apps=pid,process_name", "--format=csv,noheader", *sel)
    if rc != 0:
        module.fail_json(msg=f"listing processes on {what} failed (rc={rc}): {(err or out).strip()}", gpu=gpu,
                         processes=[], rc=rc)
    procs = _processes(out)
    if procs:
        module.fail_json(msg=f"{what} is held by {len(procs)} process(es) "
                             f"({', '.join(str(x['pid']) for x in procs)}); drain the node and stop them first",
                         gpu=gpu, processes=procs)
    if module.check_mode:
        module.exit_json(changed=True, gpu=gpu, processes=[], msg=f"would reset {what}")
    if p["toggle_persistence"]:
        rc, out, err = run("-pm", "0", *sel)
        if rc != 0:
            module.fail_json(msg=f"turning persistence mode off on {what} failed: {(err or out).strip()}",
                             gpu=gpu, processes=[])
    rc, out, err = run("-r", *sel)
    result = dict(gpu=gpu, processes=[], stdout=out, stderr=err, rc=rc)
    if p["toggle_persistence"]:
        run("-pm", "1", *sel)
    if rc != 0:
        module.fail_json(msg=f"resetting {what} failed (rc={rc}): {(err or out).strip()}", **result)
    module.exit_json(changed=True, msg=f"{what} reset", **result)


if __name__ == "__main__":
    main()
