"""The node agent `gpufleet-health check`: exit codes, JSON, Prometheus textfile (real promtool), record/replay,
state, empty environment. The Slurm side is tested against the real lab in tests/integration/health/."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from health_fixtures import GPU_FIXTURES

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import health_agent as agent

AGENT = [sys.executable, "-m", "ansible_collections.gpufleet.reliability.plugins.module_utils.cli.health_agent"]


def run_main(capsys, *argv):
    rc = agent.main(["check", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("args,rc,code", [
    (["--nvidia-smi-xml", "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml", "--kmsg", "-"], 0, "ok"),
    (["--nvidia-smi-text", "h100-8gpu-535.161.08-all-gpus-hw-power-brake-slowdown.nvidia-smi-q.txt", "--kmsg", "-"],
     1, "node_power_brake"),
    (["--nvidia-smi-xml", "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml",
      "--kmsg", "dmesg-ctime-xid119-gsp-rpc-timeout-dell-xe9680.log"], 2, "xid119"),
    (["--nvidia-smi-xml", "gb200-2gpu-580.65.06-gpu1-lost.MOCK.nvidia-smi-q-x.xml", "--kmsg", "-",
      "--expected-gpus", "2"], 2, "row_remap_failure"),
])
def test_exit_code_follows_verdict(capsys, args, rc, code):
    args = [str(GPU_FIXTURES / a) if a.endswith((".xml", ".txt", ".log")) else a for a in args]
    got, out, _err = run_main(capsys, *args, "--json")
    d = json.loads(out)
    assert got == rc and d["code"] == code
    assert d["verdict"] == ("healthy", "degraded", "unhealthy", "unknown")[rc]


def test_kmsg_replay_maps_pci_to_gpu_index(capsys, tmp_path):
    kmsg = tmp_path / "k.log"
    kmsg.write_text("[ 10.5] NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
                    "the bus.\n")
    rc, out, _err = run_main(capsys, "--nvidia-smi-xml", str(GPU_FIXTURES / "h100-8gpu-580.105.08-healthy.nvidia-smi"
                                                             "-q-x.xml"), "--kmsg", str(kmsg), "--json")
    d = json.loads(out)
    assert (rc, d["code"], d["gpu"], d["action"]) == (2, "xid79", 0, "reboot")


def test_table_output(capsys):
    capture = GPU_FIXTURES / "h100-8gpu-535.183.01-gpu2-sw-power-cap-power-brake.nvidia-smi-q.txt"
    rc, out, _err = run_main(capsys, "--nvidia-smi-text", str(capture), "--kmsg", "-")
    assert rc == 1
    assert out.splitlines()[0].endswith("degraded: hw_power_brake on gpu 2 (hw power brake slowdown active "
                                        "(escalates if it persists)) -> monitor")
    assert "SEVERITY" in out and "hw_power_brake" in out


def test_hung_fake_nvml_gives_unknown(capsys, tmp_path):
    fake = tmp_path / "hang.json"
    fake.write_text(json.dumps({"hang": {"call": "nvmlDeviceGetCount", "seconds": 3600}}))
    t0 = time.monotonic()
    rc, out, _err = run_main(capsys, "--fake-nvml", str(fake), "--kmsg", "-", "--deadline", "1", "--json")
    assert time.monotonic() - t0 < 1 + 5  # the deadline plus slack for the child (1.02 s measured on 2 busy cores)
    d = json.loads(out)
    assert (rc, d["verdict"], d["code"]) == (3, "unknown", "probe_timeout")
    assert d["probe"]["status"] == "timeout"


def test_lost_gpu_mid_probe(capsys, tmp_path):
    fake = tmp_path / "lost.json"
    fake.write_text(json.dumps({"devices": [{"index": 6, "fail": {"mode": "lost", "after_calls": 8}}]}))
    rc, out, _err = run_main(capsys, "--fake-nvml", str(fake), "--kmsg", "-", "--expected-gpus", "8", "--json")
    d = json.loads(out)
    assert (rc, d["code"], d["gpu"]) == (2, "gpu_lost", 6)
    assert "NVMLError_GpuIsLost" in d["findings"][0]["evidence"][0]


def _promtool(path):
    return subprocess.run(["promtool", "check", "metrics"], stdin=open(path, "rb"), capture_output=True, text=True,
                          check=False)


@pytest.mark.parametrize("fake", [{}, {"devices": [{"index": 1, "fail": {"mode": "lost", "after_calls": 5}},
                                                   {"index": 2, "recovery_action": 2}]},
                                  {"init_error": "DriverNotLoaded"}])
def test_textfile_passes_promtool(capsys, tmp_path, fake):
    f = tmp_path / "fake.json"
    f.write_text(json.dumps(fake))
    out_dir = tmp_path / "textfile"
    run_main(capsys, "--fake-nvml", str(f), "--kmsg", "-", "--textfile", str(out_dir))
    prom = out_dir / agent.PROM_FILE
    text = prom.read_text()
    p = _promtool(prom)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "gpufleet_health_verdict{" in text and "gpufleet_health_last_run_timestamp_seconds{" in text
    assert list(os.listdir(out_dir)) == [agent.PROM_FILE]  # atomic: no temp files left
    if fake.get("devices"):
        assert 'gpufleet_gpu_lost{node="' in text and 'code="gpu_lost"' in text


def test_record_and_replay(capsys, tmp_path):
    f = tmp_path / "fake.json"
    f.write_text(json.dumps({"devices": [{"index": 3, "remapped_rows": [0, 2, 1, 0]}]}))
    kmsg = tmp_path / "k.log"
    kmsg.write_text("[ 5.0] NVRM: Xid (PCI:0000:48:00): 63, pid=1, Row Remapper: New row marked for remapping, "
                    "reset gpu to activate.\n")
    rec = tmp_path / "rec"
    rc, out, _err = run_main(capsys, "--fake-nvml", str(f), "--kmsg", str(kmsg), "--record", str(rec), "--json")
    d = json.loads(out)
    assert rc == 2 and d["code"] == "row_remap_pending" and d["gpu"] == 3
    (case,) = list(rec.iterdir())
    names = sorted(p.name for p in case.iterdir())
    assert names == ["fake-nvml.json", "kmsg.log", "report.json", "snapshot.json"]
    assert (case / "kmsg.log").read_text().splitlines()[2] == "# ---- verbatim below this line ----"
    for replay in (["--snapshot-json", str(case / "snapshot.json")], ["--fake-nvml", str(case / "fake-nvml.json")]):
        rc2, out2, _err = run_main(capsys, *replay, "--kmsg", str(case / "kmsg.log"), "--json")
        d2 = json.loads(out2)
        assert (rc2, d2["code"], d2["gpu"]) == (2, "row_remap_pending", 3)
        assert any(x["code"] == "xid63" and x["gpu"] == 3 for x in d2["findings"])


def test_report_file(capsys, tmp_path):
    f = tmp_path / "fake.json"
    f.write_text(json.dumps({"devices": [{"index": 1, "recovery_action": 2}]}))
    out = tmp_path / "reports" / "node1.json"
    rc, stdout, _err = run_main(capsys, "--fake-nvml", str(f), "--kmsg", "-", "--report-file", str(out), "--node", "n1")
    d = json.loads(out.read_text())
    assert rc == 2 and (d["code"], d["gpu"], d["action"], d["node"]) == ("recovery_action", 1, "reboot", "n1")
    assert "SEVERITY" in stdout  # the table still goes to stdout


def test_state_file_carries_rates(capsys, tmp_path):
    state = tmp_path / "state.json"
    f = tmp_path / "fake.json"
    f.write_text(json.dumps({"device_defaults": {"pcie_replay": 100}}))
    assert run_main(capsys, "--fake-nvml", str(f), "--kmsg", "-", "--state-file", str(state), "--now", "1000")[0] == 0
    assert json.loads(state.read_text())["version"] == 1
    f.write_text(json.dumps({"device_defaults": {"pcie_replay": 10000}}))
    rc, out, _err = run_main(capsys, "--fake-nvml", str(f), "--kmsg", "-", "--state-file", str(state), "--now", "1060",
                             "--json")
    assert rc == 1 and json.loads(out)["code"] == "pcie_replay"


def test_repaired_at_clears_the_agents_memory_in_its_state_file(capsys, tmp_path):
    """The repair's verification runs the agent on its own state file with --repaired-at: the remembered Xid that
    the repair fixed is gone for the agent's next run too (issue 27 case 3)."""
    state, f, log = tmp_path / "state.json", tmp_path / "fake.json", tmp_path / "kmsg.log"
    f.write_text("{}")
    log.write_text("[  100.000000] NVRM: Xid (PCI:0000:19:00): 48, pid=1, name=x, An uncorrectable double bit error\n")
    base = ["--fake-nvml", str(f), "--state-file", str(state), "--as-of", "now", "--json"]
    rc, out, _err = run_main(capsys, *base, "--kmsg", str(log), "--now", "1000")
    assert rc == 2 and json.loads(out)["code"] == "xid48"
    rc, out, _err = run_main(capsys, *base, "--kmsg", "-", "--now", "1060")  # remembered
    assert rc == 2 and json.loads(out)["code"] == "xid48"
    rc, out, _err = run_main(capsys, *base, "--kmsg", "-", "--now", "1120", "--repaired-at", "1030")
    assert rc == 0 and json.loads(out)["verdict"] == "healthy"
    assert json.loads(state.read_text())["repaired_at"] == 1030
    rc, out, _err = run_main(capsys, *base, "--kmsg", "-", "--now", "1180")
    assert rc == 0 and json.loads(out)["verdict"] == "healthy"
    rc, _out, err = run_main(capsys, *base, "--kmsg", "-", "--repaired-at", "inf")
    assert rc == 64 and "repaired_at: expected epoch seconds" in err


def test_live_kmsg_cursor_in_state(capsys, tmp_path):
    state = tmp_path / "state.json"
    f = tmp_path / "fake.json"
    f.write_text("{}")
    run_main(capsys, "--fake-nvml", str(f), "--state-file", str(state))
    cur = json.loads(state.read_text())["kmsg_cursor"]
    assert cur["boot_id"] and isinstance(cur["seq"], int)


def test_bad_input_exits_64_naming_the_flag(capsys, tmp_path):
    rc, _out, err = run_main(capsys, "--nvidia-smi-xml", str(tmp_path / "missing.xml"))
    assert rc == 64 and "--nvidia-smi-xml: cannot read" in err
    bad = tmp_path / "cfg.json"
    bad.write_text(json.dumps({"thresholds": {"nope": 1}}))
    rc, _out, err = run_main(capsys, "--fake-nvml", str(bad), "--kmsg", "-")
    assert rc == 64 and "--fake-nvml" in err and "unknown key" in err
    rc, _out, err = run_main(capsys, "--nvidia-smi-xml",
                             str(GPU_FIXTURES / "a100-sxm4-40gb-570.148.08-healthy.nvidia-smi-q-x.xml"),
                             "--config", str(bad))
    assert rc == 64 and "thresholds.nope" in err
    assert agent.main([]) == 64


def test_empty_environment(tmp_path):
    """As HealthCheckProgram: no PATH, no HOME. The agent finds scontrol itself (PATH default)."""
    f = tmp_path / "fake.json"
    f.write_text(json.dumps({"devices": [{"index": 0, "fail": {"mode": "lost"}}]}))
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.run([*AGENT, "check", "--fake-nvml", str(f), "--kmsg", "-", "--json", "--slurm",
                        "--node", "no-such-node-gpufleet"], env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    assert p.returncode == 2, p.stderr
    d = json.loads(p.stdout)
    assert d["slurm"]["action"] == "error"
    assert "not found: is the Slurm client installed" not in d["slurm"]["detail"]  # scontrol was found on PATH


# ------------------------------------------------------------------ --slurm: slurm_act with a stand-in client
class FakeSlurm:
    """Stand-in for plugins/module_utils/slurm.SlurmClient: node() and drain() only; anything else fails."""

    def __init__(self, state="idle", flags=(), reason=""):
        from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import Node
        self.node_obj = Node("gpu1", state=state, flags=frozenset(flags), reason=reason)
        self.calls = []

    def node(self, name):
        self.calls.append(("node", name))
        return self.node_obj

    def drain(self, names, reason):
        self.calls.append(("drain", list(names), reason))
        return list(names)

    def __getattr__(self, name):  # resume, down, update...: the agent must never call them
        raise AssertionError(f"slurm_act called {name}()")


def _brake_report():
    from health_fixtures import load

    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import judge, read_nvidia_smi_text
    snap = read_nvidia_smi_text(load("h100-8gpu-535.161.08-all-gpus-hw-power-brake-slowdown.nvidia-smi-q.txt"))
    return judge(snap, (), now=2_000_000_000)


def test_node_power_brake_drains_although_degraded():
    r = _brake_report()
    assert (r.verdict, r.action, r.code, r.drain) == ("degraded", "monitor", "node_power_brake", True)
    c = FakeSlurm()
    res = agent.slurm_act(r, "gpu1", client=c)
    assert (res["action"], res["reason"]) == ("drained", "gpufleet: node_power_brake")
    assert c.calls == [("node", "gpu1"), ("drain", ["gpu1"], "gpufleet: node_power_brake")]


@pytest.mark.parametrize("state,flags,reason,action", [
    ("idle", ("DRAIN",), "gpufleet: node_power_brake", "already_drained"),   # ours: left as it is
    ("idle", ("DRAIN",), "PSU swap, ticket 42", "left_alone"),               # someone else's drain
    ("down", (), "Not responding", "left_alone"),                            # someone else's down
    ("mixed", ("DRAIN",), "admin: maintenance", "left_alone"),               # draining by someone else
])
def test_drain_request_keeps_the_ownership_rules(state, flags, reason, action):
    c = FakeSlurm(state, flags, reason)
    res = agent.slurm_act(_brake_report(), "gpu1", client=c)
    assert res["action"] == action
    assert [x[0] for x in c.calls] == ["node"]  # looked, changed nothing


def test_degraded_without_drain_request_does_not_touch_slurm():
    from health_fixtures import load

    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import judge, read_nvidia_smi_text
    snap = read_nvidia_smi_text(load("h100-8gpu-535.183.01-gpu2-sw-power-cap-power-brake.nvidia-smi-q.txt"))
    r = judge(snap, (), now=2_000_000_000)
    assert (r.verdict, r.code, r.drain) == ("degraded", "hw_power_brake", False)
    c = FakeSlurm()
    assert agent.slurm_act(r, "gpu1", client=c)["action"] == "none"
    assert c.calls == []  # not even a look


def test_unhealthy_still_drains_and_healthy_does_not():
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import Finding, Report
    c = FakeSlurm()
    bad = Report(findings=[Finding("xid", "critical", "fell off", "reboot", "xid79", 3)])
    assert agent.slurm_act(bad, "gpu1", client=c)["action"] == "drained"
    assert c.calls[-1] == ("drain", ["gpu1"], "gpufleet: xid79 gpu3")
    c = FakeSlurm()
    assert agent.slurm_act(Report(), "gpu1", client=c)["action"] == "none" and c.calls == []


def test_drain_request_in_json_table_and_textfile(capsys, tmp_path):
    capture = str(GPU_FIXTURES / "h100-8gpu-535.161.08-all-gpus-hw-power-brake-slowdown.nvidia-smi-q.txt")
    rc, out, _err = run_main(capsys, "--nvidia-smi-text", capture, "--kmsg", "-", "--json",
                             "--textfile", str(tmp_path))
    d = json.loads(out)
    assert (rc, d["verdict"], d["drain"]) == (1, "degraded", True)
    text = (tmp_path / agent.PROM_FILE).read_text()
    assert 'gpufleet_health_drain_requested{node="' in text and text.split("gpufleet_health_drain_requested{")[1] \
        .split("\n")[0].endswith(" 1")
    p = _promtool(tmp_path / agent.PROM_FILE)
    assert p.returncode == 0, p.stdout + p.stderr
    rc, out, _err = run_main(capsys, "--nvidia-smi-text", capture, "--kmsg", "-")
    assert "drain requested" in out
    healthy = str(GPU_FIXTURES / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml")
    run_main(capsys, "--nvidia-smi-xml", healthy, "--kmsg", "-", "--textfile", str(tmp_path))
    text = (tmp_path / agent.PROM_FILE).read_text()
    assert text.split("gpufleet_health_drain_requested{")[1].split("\n")[0].endswith(" 0")
