"""Acceptance: every capture in tests/fixtures/gpu/ gets the verdict and action its README names."""
from __future__ import annotations

import time

import pytest
from health_fixtures import GPU_FIXTURES, blocks, load

from ansible_collections.gpufleet.reliability.plugins.module_utils.health import (
    judge,
    read_nvidia_smi_text,
    read_nvidia_smi_xml,
)

# file -> (verdict, action, code, gpu, drain)
EXPECTED = {
    "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml": ("healthy", "none", "ok", None, False),
    "b200-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml": ("healthy", "none", "ok", None, False),
    "a100-sxm4-40gb-570.148.08-healthy.nvidia-smi-q-x.xml": ("healthy", "none", "ok", None, False),
    "h100-8gpu-535.161.08-all-gpus-hw-power-brake-slowdown.nvidia-smi-q.txt":
        ("degraded", "monitor", "node_power_brake", None, True),
    "h100-8gpu-535.183.01-gpu2-sw-power-cap-power-brake.nvidia-smi-q.txt":
        ("degraded", "monitor", "hw_power_brake", 2, False),
    "dmesg-iso-xid48-63-94-dbe-rowremap-contained.log": ("unhealthy", "reset_gpu", "xid48", None, False),
    "dmesg-iso-xid13-43-app-fault-storm.log": ("healthy", "none", "ok", None, False),
    "dmesg-ctime-xid119-gsp-rpc-timeout-dell-xe9680.log": ("unhealthy", "reset_gpu", "xid119", None, False),
    "kmsg-gb200-nvlink5-xid149-145-154.log": ("unhealthy", "reset_gpu", "xid154", None, False),
    "kmsg-fallen-off-bus-without-xid.log": ("unhealthy", "reboot", "xid79", None, False),
    "kmsg-nvswitch-sxid-samples.log": ("unhealthy", "reboot", "sxid24007", None, False),
}


def judge_file(name, **kw):
    kw.setdefault("now", time.time())
    text = load(name)
    if name.endswith(".xml"):
        return judge(read_nvidia_smi_xml(text), **kw)
    if name.endswith(".nvidia-smi-q.txt"):
        return judge(read_nvidia_smi_text(text), **kw)
    cfg = dict(kw.pop("config", {}) or {})
    cfg.setdefault("events_as_of", "latest")
    return judge(None, text, config=cfg, **kw)


def test_every_capture_is_covered():
    names = {p.name for p in GPU_FIXTURES.iterdir() if p.name != "README.md"}
    covered = set(EXPECTED) | {"gb200-2gpu-580.65.06-gpu1-lost.MOCK.nvidia-smi-q-x.xml",
                               "kmsg-xid-line-format-variants.log", "nvidia-smi-and-nvml-error-strings.txt"}
    assert names == covered


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_verdict(name):
    verdict, action, code, gpu, drain = EXPECTED[name]
    d = judge_file(name, now=2_000_000_000).to_dict()
    assert (d["verdict"], d["action"], d["code"], d["gpu"], d["drain"]) == (verdict, action, code, gpu, drain), \
        d["summary"]
    assert d["summary"].startswith(verdict)
    for f in d["findings"]:
        assert set(f) >= {"check", "severity", "gpu", "detail", "evidence", "action", "code"}


@pytest.mark.parametrize("name", [n for n, e in EXPECTED.items() if e[0] == "healthy" and n.endswith(".xml")])
def test_healthy_captures_stay_healthy_over_runs(name):
    """Run the same capture three times, 60 s apart, with state: background counters must not fire."""
    state = None
    for k in range(3):
        r = judge(read_nvidia_smi_xml(load(name)), state=state, now=1_000_000 + 60 * k)
        state = r.state
        assert r.verdict == "healthy", r.summary
        assert all(f.severity == "info" for f in r.findings)


def test_h100_background_pcie_replays_do_not_fire():
    snap = read_nvidia_smi_xml(load("h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"))
    counters = sorted(g.pcie_replay_counter for g in snap.gpus)
    assert counters[0] >= 100 and counters[-1] <= 200  # the capture's 106-174
    r = judge(snap, state={"version": 1, "gpus": {}}, now=1000)
    # second run 5 minutes later, counters grew by 10 each: 2/min, far below 31/min at Gen5 x16
    for g in snap.gpus:
        g.pcie_replay_counter += 10
    r2 = judge(snap, state=r.state, now=1300)
    assert r2.verdict == "healthy"


def test_gb200_lost_gpu1():
    """GPU 1 lost -> drain + reboot. The MOCK's GPU 0 carries mocknvml's canned values (volatile DBE 5, row-remap
    failure Yes), which on real hardware mean RMA; with the memory checks off the node verdict is the README's."""
    name = "gb200-2gpu-580.65.06-gpu1-lost.MOCK.nvidia-smi-q-x.xml"
    snap = read_nvidia_smi_xml(load(name))
    assert [g.lost for g in snap.gpus] == [False, True]
    d = judge(snap, config={"expected_gpus": 2}, now=time.time()).to_dict()
    assert d["verdict"] == "unhealthy"
    lost = [f for f in d["findings"] if f["code"] == "gpu_lost"]
    assert lost and lost[0]["gpu"] == 1 and lost[0]["action"] == "reboot"
    assert lost[0]["evidence"] and "GPU is lost" in " ".join(lost[0]["evidence"])
    assert any(f["code"] == "gpu_missing" for f in d["findings"])
    d2 = judge(snap, config={"expected_gpus": 2, "skip_checks": ["ecc", "row_remap"]}, now=time.time()).to_dict()
    assert (d2["verdict"], d2["action"], d2["code"], d2["gpu"]) == ("unhealthy", "reboot", "gpu_lost", 1)


def test_line_format_variants_as_a_whole():
    d = judge_file("kmsg-xid-line-format-variants.log").to_dict()
    assert d["verdict"] == "unhealthy" and d["action"] == "reboot" and d["code"] == "xid79"


EXPECTED_ERRORS = {
    "JosephKJ/OWOD/issues/81": ("unhealthy", "reboot", "gpu_lost"),
    "open-gpu-kernel-modules/issues/387": ("unhealthy", "reboot", "gpu_lost"),
    "nvidia-docker/issues/1553": ("unhealthy", "reboot", "gpu_lost"),
    "syno_nvidia_gpu_driver/issues/22": ("unhealthy", "reboot", "gpu_lost"),
    "plmfit/issues/40": ("unhealthy", "reboot", "gpu_lost"),
    "cppuprofile/issues/7": ("unhealthy", "reboot", "driver_mismatch"),
    "rossumai/nvgpu/issues/6": ("unhealthy", "reboot", "gpu_lost"),
    "dmlcloud/issues/58": ("unhealthy", "reboot", "gpu_lost"),
}


@pytest.mark.parametrize("src,text", blocks("nvidia-smi-and-nvml-error-strings.txt"))
def test_probe_failure_strings(src, text):
    key = next(k for k in EXPECTED_ERRORS if k in src)
    verdict, action, code = EXPECTED_ERRORS[key]
    d = judge(read_nvidia_smi_text(text), now=time.time()).to_dict()
    assert (d["verdict"], d["action"], d["code"]) == (verdict, action, code), d["summary"]
    assert d["findings"][0]["evidence"]
