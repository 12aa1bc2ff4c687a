# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# The gpu_health module run for real through Ansible: pytest-ansible's `localhost` fixture for plain calls,
# ansible-runner for check mode. Replay captures and the fake NVML stand in for the GPUs.
import json
import os
import sys
import tempfile
from pathlib import Path

import ansible_runner
import yaml

REPO = Path(__file__).resolve().parents[3]
FIX = REPO / "tests" / "fixtures" / "gpu"
MODULE = "gpufleet.reliability.gpu_health"


def gpu_health(host, **kwargs):
    return getattr(host, MODULE)(**kwargs)["localhost"]


def test_healthy_xml_replay(localhost):
    res = gpu_health(localhost, nvidia_smi_xml=str(FIX / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"),
                     kmsg_path="-", expected_gpus=8)
    assert res.is_successful, res
    assert res["changed"] is False
    assert (res["verdict"], res["action"], res["code"], res["gpu"]) == ("healthy", "none", "ok", None)
    fact = res["ansible_facts"]["gpufleet_health"]
    assert fact["verdict"] == "healthy" and fact["probe"]["source"] == "nvidia-smi-xml" and fact["catalog_version"]


def test_unhealthy_kmsg_replay_with_gpu_index(localhost, tmp_path):
    k = tmp_path / "k.log"
    k.write_text("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:53:00): 119, pid=1, name=nvidia-smi, Timeout after "
                 "6s of waiting for RPC response from GPU4 GSP!\n")
    res = gpu_health(localhost, nvidia_smi_xml=str(FIX / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"),
                     kmsg_path=str(k))
    assert res.is_successful, res  # an unhealthy node is a result, not a task failure
    assert (res["verdict"], res["action"], res["code"], res["gpu"]) == ("unhealthy", "reset_gpu", "xid119", 0)
    assert res["drain_reason"] == "gpufleet: xid119 gpu0"
    assert res["findings"][0]["evidence"][0].startswith("[Sun Feb 23")


def test_repaired_at_forgets_what_the_step_fixed_and_keeps_what_came_after(localhost, tmp_path):
    """The kernel log of a capture (events judged as of its newest line): an Xid dated before the repair step
    started is what the step fixed; one after it still counts; the time is kept in the state file."""
    k = tmp_path / "k.log"
    line = ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:53:00): 119, pid=1, name=nvidia-smi, Timeout after "
            "6s of waiting for RPC response from GPU4 GSP!\n")
    k.write_text(line)
    xml, state = str(FIX / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"), tmp_path / "state.json"
    before, after = 1740327858 - 2 * 86400, 1740327858 + 2 * 86400  # the line: 2025-02-23 16:24:18 (any zone)
    res = gpu_health(localhost, nvidia_smi_xml=xml, kmsg_path=str(k), state_path=str(state), repaired_at=after)
    assert res.is_successful and res["verdict"] == "healthy", res
    assert json.loads(state.read_text())["repaired_at"] == after
    state.unlink()
    res = gpu_health(localhost, nvidia_smi_xml=xml, kmsg_path=str(k), repaired_at=before)
    assert res["code"] == "xid119", res
    res = gpu_health(localhost, nvidia_smi_xml=xml, kmsg_path="-", repaired_at=-1)
    assert res.is_failed and "repaired_at: expected epoch seconds" in res["msg"], res


def test_text_replay_thresholds_and_skip(localhost):
    text = str(FIX / "h100-8gpu-535.183.01-gpu2-sw-power-cap-power-brake.nvidia-smi-q.txt")
    res = gpu_health(localhost, nvidia_smi_text=text, kmsg_path="-")
    assert (res["verdict"], res["code"], res["gpu"]) == ("degraded", "hw_power_brake", 2)
    res = gpu_health(localhost, nvidia_smi_text=text, kmsg_path="-", skip_checks=["clocks"])
    assert res["verdict"] == "healthy"


def test_fake_nvml_lost_gpu_and_state(localhost, tmp_path):
    fake = tmp_path / "fake.yml"
    fake.write_text(yaml.safe_dump({"devices": [{"index": 4, "fail": {"mode": "lost", "after_calls": 6}}]}))
    state = tmp_path / "state.json"
    res = gpu_health(localhost, fake_nvml=str(fake), kmsg_path="-", expected_gpus=8, state_path=str(state))
    assert (res["verdict"], res["code"], res["gpu"], res["action"]) == ("unhealthy", "gpu_lost", 4, "reboot")
    assert res["probe"]["source"] == "fake-nvml" and res["changed"] is False
    assert json.loads(state.read_text())["version"] == 1


def test_hung_probe_is_unknown(localhost, tmp_path):
    fake = tmp_path / "hang.json"
    fake.write_text(json.dumps({"hang": {"call": "nvmlInit", "seconds": 3600}}))
    res = gpu_health(localhost, fake_nvml=str(fake), kmsg_path="-", probe_deadline=1.0)
    assert res.is_successful, res
    assert (res["verdict"], res["code"]) == ("unknown", "probe_timeout")


def test_bad_input_names_the_option(localhost, tmp_path):
    res = gpu_health(localhost, nvidia_smi_xml=str(tmp_path / "missing.xml"))
    assert res.is_failed and "nvidia_smi_xml: cannot read" in res["msg"]
    res = gpu_health(localhost, nvidia_smi_xml=str(FIX / "a100-sxm4-40gb-570.148.08-healthy.nvidia-smi-q-x.xml"),
                     kmsg_path="-", thresholds={"bogus": 1})
    assert res.is_failed and "thresholds.bogus" in res["msg"]
    res = gpu_health(localhost, nvidia_smi_xml="/x", fake_nvml="/y")
    assert res.is_failed and "mutually exclusive" in res["msg"]


def _play(tmp_path, monkeypatch, tasks, cmdline=""):
    pdd = Path(tempfile.mkdtemp(prefix="runner", dir=tmp_path))  # fresh per play (runner keeps env/cmdline)
    (pdd / "project").mkdir(parents=True, exist_ok=True)
    (pdd / "project" / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False,
                                                              "tasks": tasks}]))
    monkeypatch.chdir(REPO)
    # ansible-runner execs ansible-playbook from PATH
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="play.yml", quiet=True, cmdline=cmdline,
        inventory={"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                   "ansible_python_interpreter": sys.executable}}}},
        envvars={"ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections")},
    )
    results = [e["event_data"]["res"] for e in r.events if e["event"] in ("runner_on_ok", "runner_on_failed")]
    return r, results


def test_check_mode_reads_but_writes_no_state(tmp_path, monkeypatch):
    state = tmp_path / "state.json"
    fake = tmp_path / "fake.json"
    fake.write_text("{}")
    tasks = [{"name": "health", MODULE: {"fake_nvml": str(fake), "kmsg_path": "-", "state_path": str(state)},
              "register": "h"},
             {"name": "fact", "ansible.builtin.assert": {"that": ["gpufleet_health.verdict == 'healthy'",
                                                                  "h.verdict == 'healthy'"]}}]
    r, results = _play(tmp_path, monkeypatch, tasks, cmdline="--check")
    assert r.status == "successful", (results, r.stdout.read())
    assert results[0]["changed"] is False and not state.exists()
    r, results = _play(tmp_path, monkeypatch, tasks)
    assert r.status == "successful", results
    assert results[0]["changed"] is False and state.exists(), results
