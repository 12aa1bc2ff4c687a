# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# The slurm_conf module run for real through Ansible: pytest-ansible's `localhost` for plain calls, and
# ansible-playbook (through ansible-runner) for --check and --diff, which the pytest-ansible dispatcher lacks.
import os
import re
import stat
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
MODULE = "gpufleet.reliability.slurm_conf"

SLURM_CONF = """\
# site slurm.conf
ClusterName=lab
SlurmctldPort=16817
HealthCheckInterval = 5   # lab value
NodeName=node[1-4] Port=[16901-16904] CPUs=16 \\
  RealMemory=64000 Gres=gpu:h100:8 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def slurm_conf(host, **kwargs):
    return getattr(host, MODULE)(**kwargs)["localhost"]


@pytest.fixture
def conf(tmp_path):
    path = tmp_path / "slurm.conf"
    path.write_text(SLURM_CONF)
    os.chmod(path, 0o640)
    return path


def test_set_change_remove_is_idempotent(localhost, conf):
    settings = {"HealthCheckInterval": 300, "HealthCheckNodeState": "ANY", "KillOnBadExit": 1,
                "PrologFlags": ["Alloc", "DeferBatch"], "ClusterName": None}
    res = slurm_conf(localhost, path=str(conf), settings=settings)
    assert res.is_successful, res
    assert res["changed"] is True and res["kind"] == "slurm"
    assert res["changes"] == ["HealthCheckInterval", "HealthCheckNodeState", "KillOnBadExit", "PrologFlags",
                              "ClusterName"]
    assert res["reconfigure_needed"] is True and res["restart_needed"] is False
    text = conf.read_text()
    assert "HealthCheckInterval = 300   # lab value\n" in text and "ClusterName" not in text
    assert "HealthCheckNodeState=ANY\nKillOnBadExit=1\nPrologFlags=Alloc,DeferBatch\nNodeName=" in text
    assert stat.S_IMODE(os.stat(conf).st_mode) == 0o640
    again = slurm_conf(localhost, path=str(conf), settings=settings)
    assert again.is_successful and again["changed"] is False
    assert again["reconfigure_needed"] is False and again["restart_needed"] is False
    assert conf.read_text() == text
    assert sorted(p.name for p in conf.parent.iterdir()) == ["slurm.conf"]  # no temp file left


def test_prolog_flags_of_the_site_stay_unless_told_otherwise(localhost, conf):
    """Issue 26 section 2: the module's example set PrologFlags=Alloc,DeferBatch and dropped a site's Contain
    (pam_slurm_adopt) and X11. PrologFlags merge by default; merge_keys: [] replaces, which removes a flag."""
    conf.write_text(SLURM_CONF.replace("ClusterName=lab\n", "ClusterName=lab\nPrologFlags=Contain,X11\n"))
    res = slurm_conf(localhost, path=str(conf), settings={"PrologFlags": ["Alloc", "contain", "DeferBatch"]})
    assert res.is_successful and res["changed"] is True, res
    assert "\nPrologFlags=Contain,X11,Alloc,DeferBatch\n" in conf.read_text()
    again = slurm_conf(localhost, path=str(conf), settings={"PrologFlags": "Alloc,DeferBatch"})
    assert again.is_successful and again["changed"] is False, again  # idempotent
    res = slurm_conf(localhost, path=str(conf), settings={"PrologFlags": ["Alloc"]}, merge_keys=[])
    assert res.is_successful and res["changed"] is True and "\nPrologFlags=Alloc\n" in conf.read_text()


def test_nodes_and_partitions(localhost, conf):
    res = slurm_conf(localhost, path=str(conf), slurm_version="22.05.8",
                     nodes=[{"NodeName": "node[1-4]", "RealMemory": 32000, "Weight": 5},
                            {"NodeName": "node5", "CPUs": 16, "Port": 16905}],
                     partitions=[{"PartitionName": "debug", "Nodes": "node5", "State": "UP"},
                                 {"PartitionName": "gpu", "state": "absent"}])
    assert res.is_successful, res
    assert res["restart_needed"] is True and res["reconfigure_needed"] is False
    assert res["restart_reasons"] == ["NodeName=node[1-4] RealMemory", "NodeName=node[1-4] Weight",
                                      "NodeName=node5"]
    lines = conf.read_text().splitlines()
    assert lines[-4:] == ["NodeName=node[1-4] Port=[16901-16904] CPUs=16 \\",
                          "  RealMemory=32000 Gres=gpu:h100:8 State=UNKNOWN Weight=5",
                          "NodeName=node5 CPUs=16 Port=16905",
                          "PartitionName=debug Nodes=node5 State=UP"]
    again = slurm_conf(localhost, path=str(conf),
                       nodes=[{"NodeName": "node[1-4]", "RealMemory": 32000, "Weight": 5},
                              {"NodeName": "node5", "CPUs": 16, "Port": 16905}],
                       partitions=[{"PartitionName": "debug", "Nodes": "node5", "State": "UP"},
                                   {"PartitionName": "gpu", "state": "absent"}])
    assert again["changed"] is False
    gone = slurm_conf(localhost, path=str(conf), nodes=[{"NodeName": "node5", "state": "absent"}])
    assert gone["changed"] is True and "NodeName=node5" not in conf.read_text()


def test_restart_keys_are_reported(localhost, conf):
    settings = {"SlurmctldPort": 16818, "AuthAltTypes": "auth/jwt", "SelectType": "select/linear",
                "HealthCheckInterval": 60}
    res = slurm_conf(localhost, path=str(conf), settings=settings, slurm_version="22.05.8")
    assert res["restart_needed"] is True and res["reconfigure_needed"] is False
    assert res["restart_reasons"] == ["SlurmctldPort", "AuthAltTypes", "SelectType"]
    assert res["slurm_version"] == "22.05.8"
    conf.write_text(SLURM_CONF)
    res = slurm_conf(localhost, path=str(conf), settings=settings, slurm_version="24.11.5")
    assert res["restart_reasons"] == ["SlurmctldPort", "AuthAltTypes"]  # 23.11+: reconfigure re-execs
    conf.write_text(SLURM_CONF)
    res = slurm_conf(localhost, path=str(conf), settings={"SelectType": "select/linear"}, slurm_version="24.11")
    assert res["restart_needed"] is False and res["reconfigure_needed"] is True


def test_slurm_version_from_scontrol_and_bad_version(localhost, tmp_path, conf):
    # scontrol on the PATH is asked (the Debian client on this machine, or the lab's wrapper); even for --version
    # it must read a valid slurm.conf: SLURM_CONF when set, else the file next to path
    valid = tmp_path / "etc" / "slurm.conf"
    valid.parent.mkdir()
    valid.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    res = slurm_conf(localhost, path=str(valid), settings={"KillOnBadExit": 1})
    assert res.is_successful, res
    assert re.fullmatch(r"\d+\.\d+\.\d+", res["slurm_version"] or ""), res
    res = slurm_conf(localhost, path=str(conf), settings={"KillOnBadExit": 0}, slurm_version="latest")
    assert res.is_failed and "slurm_version: expected a release such as 22.05.8" in res["msg"]


def test_gres_and_cgroup_kinds_from_file_names(localhost, tmp_path):
    gres = tmp_path / "gres.conf"
    gres.write_text("AutoDetect=off\nNodeName=node[1-4] Name=gpu Type=h100 File=/dev/nvidia[0-7]\n")
    res = slurm_conf(localhost, path=str(gres), settings={"AutoDetect": "nvml"}, slurm_version="22.05")
    assert res.is_successful and res["kind"] == "gres" and res["restart_reasons"] == ["AutoDetect"]
    assert gres.read_text().startswith("AutoDetect=nvml\nNodeName=node[1-4] Name=gpu")
    cgroup = tmp_path / "cgroup.conf"
    res = slurm_conf(localhost, path=str(cgroup), create=True, settings={"ConstrainDevices": True})
    assert res.is_successful and res["kind"] == "cgroup" and res["changed"] is True
    assert cgroup.read_text() == "ConstrainDevices=yes\n"
    assert slurm_conf(localhost, path=str(cgroup), settings={"ConstrainDevices": "yes"})["changed"] is False


def test_backup(localhost, conf):
    res = slurm_conf(localhost, path=str(conf), settings={"HealthCheckInterval": 120}, backup=True)
    assert res["changed"] is True
    assert Path(res["backup_file"]).read_text() == SLURM_CONF
    assert Path(res["backup_file"]).parent == conf.parent


@pytest.mark.parametrize("args,message", [
    ({"settings": {"HealthCheckInterval": "often"}},
     "settings.HealthCheckInterval: HealthCheckInterval='often' is not valid: expected an integer >= 0"),
    ({"settings": {"HealthCheckNodeState": "BUSY"}}, "expected a comma-separated list of ALLOC, ANY"),
    ({"settings": {"RebootProgram": "reboot"}}, "RebootProgram='reboot' is not valid: expected an absolute path"),
    ({"settings": {"Health Check": 1}}, "invalid key 'Health Check'"),
    ({"nodes": [{"CPUs": 4}]}, "nodes[0]: NodeName is required"),
    ({"nodes": [{"NodeName": "n1", "state": "UP"}]}, "nodes[0].state must be present or absent"),
    ({"nodes": [{"NodeName": "n1", "Port": "high"}]}, "nodes[0]: NodeName=n1: Port='high' is not valid"),
    ({"partitions": [{"PartitionName": "p", "Default": "perhaps"}]},
     "Default='perhaps' is not valid: expected a boolean"),
])
def test_bad_input_fails_clearly_and_leaves_the_file(localhost, conf, args, message):
    res = slurm_conf(localhost, path=str(conf), **args)
    assert res.is_failed, res
    assert message in res["msg"]
    assert conf.read_text() == SLURM_CONF


def test_malformed_line_names_the_line_and_writes_nothing(localhost, conf):
    broken = SLURM_CONF.replace("ClusterName=lab", "ClusterName lab")
    conf.write_text(broken)
    res = slurm_conf(localhost, path=str(conf), settings={"HealthCheckInterval": 300})
    assert res.is_failed
    assert f"{conf} line 2: expected Key=Value" in res["msg"] and "ClusterName lab" in res["msg"]
    assert conf.read_text() == broken


def test_bad_value_in_file_and_validate_false(localhost, conf):
    conf.write_text(SLURM_CONF.replace("= 5", "= soon"))
    res = slurm_conf(localhost, path=str(conf), settings={"KillOnBadExit": 1})
    assert res.is_failed and "line 4: HealthCheckInterval='soon'" in res["msg"]
    res = slurm_conf(localhost, path=str(conf), settings={"KillOnBadExit": 1}, validate=False)
    assert res.is_successful and res["changed"] is True


def test_missing_file_unknown_kind_wrong_kind(localhost, tmp_path):
    res = slurm_conf(localhost, path=str(tmp_path / "slurm.conf"), settings={"A": 1})
    assert res.is_failed and "does not exist (set create=true" in res["msg"]
    odd = tmp_path / "site.conf"
    odd.write_text("A=1\n")
    res = slurm_conf(localhost, path=str(odd), settings={"A": 2})
    assert res.is_failed and "set kind to slurm, gres or cgroup" in res["msg"]
    res = slurm_conf(localhost, path=str(odd), kind="slurm", settings={"A": 2})
    assert res.is_successful and odd.read_text() == "A=2\n"
    res = slurm_conf(localhost, path=str(odd), kind="gres", partitions=[{"PartitionName": "p"}])
    assert res.is_failed and "only in slurm.conf" in res["msg"]


def _play(tmp_path, monkeypatch, tasks, cmdline=""):
    # a fresh private data dir per run: ansible-runner keeps settings such as the command line in it
    runs = len(list(tmp_path.glob("runner-*")))
    pdd = tmp_path / f"runner-{runs}"
    (pdd / "project").mkdir(parents=True)
    play = [{"name": "slurm_conf", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    (pdd / "project" / "play.yml").write_text(yaml.safe_dump(play))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="play.yml", quiet=True, cmdline=cmdline,
        inventory={"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                   "ansible_python_interpreter": sys.executable}}}},
        envvars={"ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections")},
    )
    results = [e["event_data"]["res"] for e in r.events if e["event"] in ("runner_on_ok", "runner_on_failed")]
    return r, results


def test_check_mode_and_diff_through_ansible_playbook(tmp_path, monkeypatch, conf):
    task = {"name": "profile", MODULE: {"path": str(conf), "settings": {"HealthCheckInterval": 300,
                                                                        "RebootProgram": "/usr/sbin/reboot"}}}
    r, results = _play(tmp_path, monkeypatch, [task], cmdline="--check --diff")
    assert r.status == "successful", results
    assert results[0]["changed"] is True and results[0]["reconfigure_needed"] is True
    assert conf.read_text() == SLURM_CONF  # check mode wrote nothing
    diff = results[0]["diff"]
    assert diff["before"] == SLURM_CONF and diff["before_header"] == str(conf)
    assert "HealthCheckInterval = 300   # lab value\n" in diff["after"]
    assert "RebootProgram=/usr/sbin/reboot\n" in diff["after"]
    r, results = _play(tmp_path, monkeypatch, [task])
    assert results[0]["changed"] is True and conf.read_text() == diff["after"]
    r, results = _play(tmp_path, monkeypatch, [task], cmdline="--check --diff")
    assert results[0]["changed"] is False and results[0]["diff"]["before"] == results[0]["diff"]["after"]
