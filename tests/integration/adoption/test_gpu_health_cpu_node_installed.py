# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_health on this host, which has no NVIDIA driver (real NVML: nvmlInit raises NVMLError_LibraryNotFound):
healthy with expected_gpus 0 (a CPU node), unhealthy -> reimage when GPUs are expected."""

from __future__ import annotations

import ctypes.util
import json

import yaml


def run_gpu_health(ic, tmp_path, expected):
    out = tmp_path / f"result-{expected}.json"
    play = [{"name": "gpu_health on a node without a driver", "hosts": "localhost", "connection": "local",
             "gather_facts": False,
             "tasks": [{"name": "Probe", "gpufleet.reliability.gpu_health": {"expected_gpus": expected},
                        "register": "probe"},
                       {"name": "Keep the result", "ansible.builtin.copy": {
                           "content": "{{ probe | to_json }}", "dest": str(out), "mode": "0644"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    ic.run("ansible-playbook", "-i", "localhost,", str(tmp_path / "play.yml"))
    return json.loads(out.read_text())


def test_cpu_node_without_driver(installed_collection, tmp_path):
    assert ctypes.util.find_library("nvidia-ml") is None, "this test needs a host without the NVIDIA driver"
    r = run_gpu_health(installed_collection, tmp_path, 0)
    assert (r["verdict"], r["action"], r["code"]) == ("healthy", "none", "ok"), r
    assert [f["code"] for f in r["findings"]] == ["no_gpu_expected"]
    r = run_gpu_health(installed_collection, tmp_path, 8)
    assert (r["verdict"], r["action"], r["code"]) == ("unhealthy", "reimage", "nvml_missing"), r
