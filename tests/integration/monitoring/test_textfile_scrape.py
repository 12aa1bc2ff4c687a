"""The agent's textfile read by Debian's real prometheus-node-exporter (textfile collector) and scraped by a real
prometheus on loopback that also evaluates the shipped alert rules: the series arrive with their labels, the info
metric joins a GPU's Xid counter to its UUID, a lost GPU fires GpufleetGpuLost (a healthy node fires nothing), and
every query of the shipped Grafana dashboard runs against the real server."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import MONITORING, REPO, http_get, prom_query, start_node_exporter, start_prometheus, wait_for

CAPTURE = REPO / "tests" / "fixtures" / "gpu" / "h100-8gpu-580.105.08-healthy.nvidia-smi-q-x.xml"
AGENT = [sys.executable, "-m", "ansible_collections.gpufleet.reliability.plugins.module_utils.cli.health_agent",
         "check"]
XID79 = "[ 7.5] NVRM: Xid (PCI:0000:64:00): 79, pid=1, GPU has fallen off the bus.\n"


def run_agent(tmp_path, node, kmsg_text, textfile_dir, *extra):
    kmsg = tmp_path / f"{node}.kmsg"
    kmsg.write_text(kmsg_text)
    argv = AGENT + ["--nvidia-smi-xml", str(CAPTURE), "--kmsg", str(kmsg), "--node", node,
                    "--textfile", str(textfile_dir), "--state-file", str(tmp_path / f"{node}.state"), "--json",
                    *extra]
    p = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert p.returncode in (0, 2), p.stderr
    return json.loads(p.stdout)


def test_node_exporter_and_prometheus_read_the_agent(tmp_path, daemons):
    sick_dir, healthy_dir = tmp_path / "tf-sick", tmp_path / "tf-healthy"
    assert run_agent(tmp_path, "gpu-sick", XID79, sick_dir)["code"] == "xid79"
    assert run_agent(tmp_path, "gpu-ok", "", healthy_dir)["verdict"] == "healthy"
    targets = [start_node_exporter(daemons, tmp_path, sick_dir, "ne-sick"),
               start_node_exporter(daemons, tmp_path, healthy_dir, "ne-ok")]
    base = start_prometheus(daemons, tmp_path, targets, [MONITORING / "prometheus" / "gpufleet-alerts.yml"])

    info = wait_for(lambda: len(r := prom_query(base, "gpufleet_gpu_info")) == 16 and r, 60, "16 GPU info series")
    uuids = {s["metric"]["uuid"] for s in info}
    assert len(uuids) == 8 and all(u.startswith("GPU-") for u in uuids)  # both nodes replay the same capture
    assert {s["metric"]["model_name"] for s in info} == {"NVIDIA H100 80GB HBM3"}
    assert prom_query(base, "node_textfile_scrape_error") and all(
        s["value"][1] == "0" for s in prom_query(base, "node_textfile_scrape_error"))

    joined = prom_query(base, 'gpufleet_gpu_xid_errors_total{xid="79"} * on(node, gpu) group_left(uuid, model_name) '
                              'gpufleet_gpu_info')
    assert len(joined) == 1 and joined[0]["metric"]["node"] == "gpu-sick" and joined[0]["metric"]["gpu"] == "1"
    gpu1 = [s["metric"]["uuid"] for s in info if s["metric"]["gpu"] == "1"][0]
    assert joined[0]["metric"]["uuid"] == gpu1 and joined[0]["value"][1] == "1"
    verdicts = {(s["metric"]["node"], s["metric"]["verdict"]) for s in prom_query(base, "gpufleet_health_verdict == 1")}
    assert verdicts == {("gpu-sick", "unhealthy"), ("gpu-ok", "healthy")}

    def firing():
        data = json.loads(http_get(f"{base}/api/v1/alerts"))
        return [a for a in data["data"]["alerts"] if a["state"] == "firing"]
    alerts = wait_for(firing, 60, "an alert to fire")
    names = {(a["labels"]["alertname"], a["labels"].get("node")) for a in alerts}
    assert ("GpufleetGpuLost", "gpu-sick") in names
    assert not [n for n in names if n[1] == "gpu-ok"], names

    dashboard = json.loads((MONITORING / "grafana" / "gpufleet-dashboard.json").read_text())
    answered = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            if prom_query(base, target["expr"].replace("$node", ".*")):  # every query runs (status success)
                answered.add(panel["title"])
    # the agent's panels have data; repair and rate panels need the repair run and more than one sample
    assert {"Nodes by verdict", "GPUs lost", "Findings (with GPU identity)", "GPU temperature",
            "Recommended actions", "Check and probe duration"} <= answered, answered
