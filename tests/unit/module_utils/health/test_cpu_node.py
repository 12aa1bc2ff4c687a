# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A CPU node (expected_gpus: 0) without an NVIDIA driver is healthy; a GPU node without one is not."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import Snapshot, judge

NO_LIB = Snapshot(probe_status="failed", probe_error_code=12, probe_error="NVML Shared Library Not Found")
NOT_LOADED = Snapshot(probe_status="failed", probe_error_code=9, probe_error="Driver Not Loaded")
NO_PYNVML = Snapshot(probe_status="failed", probe_error_code=12,
                     probe_error="pynvml (nvidia-ml-py) not importable: No module named 'pynvml'")


@pytest.mark.parametrize("snap", [NO_LIB, NOT_LOADED, NO_PYNVML])
def test_cpu_node_without_driver_is_healthy(snap):
    r = judge(snap, config={"expected_gpus": 0}, now=0)
    assert (r.verdict, r.action, r.exit_code) == ("healthy", "none", 0)
    assert [(f.severity, f.code) for f in r.findings] == [("info", "no_gpu_expected")]


@pytest.mark.parametrize("expected", [None, 1, 8])
def test_gpu_node_without_driver_stays_unhealthy(expected):
    config = {} if expected is None else {"expected_gpus": expected}
    assert (judge(NO_LIB, config=config, now=0).code, judge(NOT_LOADED, config=config, now=0).code) == (
        "nvml_missing", "driver_not_loaded")
    assert judge(NO_LIB, config=config, now=0).action == "reimage"


def test_cpu_node_keeps_the_other_probe_failures():
    # a driver that is there but broken, or a probe that failed for another reason, is never "no GPU expected"
    mismatch = Snapshot(probe_status="failed", probe_error_code=18, probe_error="Driver/library version mismatch")
    assert judge(mismatch, config={"expected_gpus": 0}, now=0).code == "driver_mismatch"
    other = Snapshot(probe_status="failed", probe_error_code=999, probe_error="Unknown Error")
    assert judge(other, config={"expected_gpus": 0}, now=0).verdict == "unknown"
    assert judge(Snapshot(probe_status="timeout"), config={"expected_gpus": 0}, now=0).verdict == "unknown"
