# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""AWX / AAP as an admin sets it up: ansible-builder turns execution-environment.yml (with the tarball built from
this checkout) into a build context; the EE has no Slurm; every playbook, survey variable, credential, credential
type and inventory file that docs/awx/objects.yml names exists in the installed collection; the health sweep
publishes its findings with set_stats."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import ansible_runner
import yaml
from adoption_helpers import BIN, REPO

BUILTIN_CREDENTIAL_TYPES = {"Machine"}


def dev_pins() -> dict:
    pins = {}
    for line in (REPO / "requirements/dev.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def objects_tasks() -> list:
    return yaml.safe_load((REPO / "docs/awx/objects.yml").read_text())[0]["tasks"]


def of_kind(kind: str) -> list:
    return [t[f"awx.awx.{kind}"] for t in objects_tasks() if f"awx.awx.{kind}" in t]


def objects_vars() -> dict:
    return yaml.safe_load((REPO / "docs/awx/objects.yml").read_text())[0]["vars"]


def resolve(value, variables: dict):
    """A plain "{{ name }}" from the play's vars, else the value itself."""
    m = re.fullmatch(r"\{\{\s*(\w+)\s*\}\}", value) if isinstance(value, str) else None
    return variables[m.group(1)] if m else value


def test_ansible_builder_create(installed_collection, tmp_path):
    (tmp_path / "dist").mkdir()
    shutil.copy(installed_collection.tarball, tmp_path / "dist" / "gpufleet-reliability.tar.gz")
    shutil.copy(REPO / "execution-environment.yml", tmp_path / "execution-environment.yml")
    proc = subprocess.run([str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "-c", "context"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ctx = tmp_path / "context"
    text = next(p for p in (ctx / "Containerfile", ctx / "Dockerfile") if p.exists()).read_text()
    assert "ansible-galaxy collection install" in text
    reqs = yaml.safe_load((ctx / "_build" / "requirements.yml").read_text())
    assert reqs["collections"] == [{"name": "/build/dist/gpufleet-reliability.tar.gz", "type": "file"}]
    assert (ctx / "_build" / "dist" / "gpufleet-reliability.tar.gz").is_file()


def test_ee_has_no_slurm_and_the_tested_versions():
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    pins = dev_pins()
    # the EE runs the ansible-core and ansible-runner the collection is tested with (requirements/dev.txt)
    assert ee["dependencies"]["ansible_core"]["package_pip"] == f"ansible-core=={pins['ansible-core']}"
    assert ee["dependencies"]["ansible_runner"]["package_pip"] == f"ansible-runner=={pins['ansible-runner']}"
    meta = yaml.safe_load((REPO / "meta/execution-environment.yml").read_text())
    bindep = (REPO / meta["dependencies"]["system"]).read_text()
    assert [line for line in bindep.splitlines() if line.strip() and not line.startswith("#")] == []
    for line in (REPO / meta["dependencies"]["python"]).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            assert pins[name.lower()] == version, line
    # the version of the collection is written once (galaxy.yml): the EE names a version-free tarball
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    named = [c["name"] for c in ee["dependencies"]["galaxy"]["collections"]] + \
        [f["src"] for f in ee["additional_build_files"]]
    assert named and not [n for n in named if version in n], named


def test_objects_name_only_what_exists(installed_collection):
    coll = installed_collection.path
    variables = objects_vars()
    templates = of_kind("job_template")
    assert {t["playbook"] for t in templates} == {"playbooks/repair.yml", "playbooks/health_sweep.yml"}
    repair_opts = set(yaml.safe_load((coll / "roles/node_repair/meta/argument_specs.yml").read_text())
                      ["argument_specs"]["main"]["options"])
    sweep_text = (coll / "playbooks/health_sweep.yml").read_text()
    sweep_vars = set(re.findall(r"^#\s+(gpufleet_sweep_\w+)\s", sweep_text, re.M))
    assert sweep_vars == {"gpufleet_sweep_hosts", "gpufleet_sweep_become", "gpufleet_sweep_expected_gpus",
                          "gpufleet_sweep_drain"}
    assert all(v in sweep_text.split("\n- name:", 1)[1] for v in sweep_vars)  # documented and used
    created_creds = {resolve(c["name"], variables): c for c in of_kind("credential")}
    created_types = {c["name"] for c in of_kind("credential_type")}
    for t in templates:
        assert (coll / t["playbook"]).is_file(), t["playbook"]
        known = repair_opts | (sweep_vars if t["playbook"].endswith("health_sweep.yml") else set())
        extra = resolve(t.get("extra_vars", {}), variables)
        if isinstance(extra, dict):
            assert set(extra) <= repair_opts, set(extra) - repair_opts
        survey = resolve(t.get("survey_spec"), variables)
        assert t.get("survey_enabled") and survey["spec"], t["name"]
        for q in survey["spec"]:
            assert q["variable"] in known, (t["name"], q["variable"])
            assert q["type"] in ("text", "integer", "multiplechoice", "multiselect", "password", "float",
                                 "textarea")
            if "choices" in q and "default" in q:
                assert q["default"] in q["choices"]
        for cred in t["credentials"]:
            assert resolve(cred, variables) in created_creds, cred
    for cred in created_creds.values():
        assert cred["credential_type"] in created_types | BUILTIN_CREDENTIAL_TYPES, cred["credential_type"]

    # the inventory source: a file of the project, for the slurm inventory plugin, fed by the slurmrestd credential
    sources = of_kind("inventory_source")
    assert len(sources) == 1
    src = sources[0]
    inv_file = coll / src["source_path"]
    inv = yaml.safe_load(inv_file.read_text())
    assert inv["plugin"] == "gpufleet.reliability.slurm" and inv["source"] == "rest"
    assert inv_file.name.endswith(".slurm.yml")
    plugin_doc = yaml.safe_load(re.search(r'DOCUMENTATION = r"""(.*?)"""', (coll / "plugins/inventory/slurm.py")
                                          .read_text(), re.S).group(1))
    opts = plugin_doc["options"]
    assert set(inv) - {"plugin", "compose", "groups", "keyed_groups"} <= set(opts)
    cred = created_creds[resolve(src["credential"], variables)]
    ctype = next(c for c in of_kind("credential_type") if c["name"] == cred["credential_type"])
    injected = set(ctype["injectors"]["env"])
    wanted = {e["name"] for key in ("rest_url", "rest_user", "rest_token") for e in opts[key]["env"]}
    assert injected == wanted, (injected, wanted)
    fields = {f["id"] for f in ctype["inputs"]["fields"]}
    for value in ctype["injectors"]["env"].values():
        # AWX renders the injector; in the objects playbook its braces are escaped from Ansible
        field = re.fullmatch(r"\{\{ '\{\{' \}\} (\w+) \{\{ '\}\}' \}\}", value).group(1)
        assert field in fields
    assert set(cred["inputs"]) == fields
    assert next(f for f in ctype["inputs"]["fields"] if f["id"] == "slurm_jwt")["secret"] is True

    # the workflow's nodes are templates created here
    wf = of_kind("workflow_job_template")[0]
    names = {t["name"] for t in templates}
    kinds = [n["unified_job_template"]["type"] for n in wf["workflow_nodes"]]
    assert kinds == ["job_template", "workflow_approval", "job_template"]
    assert {n["unified_job_template"]["name"] for n in wf["workflow_nodes"]
            if n["unified_job_template"]["type"] == "job_template"} <= names


def test_objects_playbook_syntax(installed_collection, tmp_path):
    # awx.awx is not installed here: the syntax check of the sweep (which is ours) is the executable part
    installed_collection.run("ansible-playbook", "--syntax-check", "-i", "localhost,",
                             str(installed_collection.path / "playbooks/health_sweep.yml"))


def test_health_sweep_publishes_findings(installed_collection, tmp_path, monkeypatch):
    """The sweep from the installed collection on this host (no NVIDIA driver: real NVML fails to load)."""
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + ":" + __import__("os").environ["PATH"])
    pdd = tmp_path / "runner"
    (pdd / "project").mkdir(parents=True)
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="gpufleet.reliability.health_sweep", quiet=True,
        extravars={"gpufleet_sweep_hosts": "gpu1,cpu1", "gpufleet_sweep_become": False, "gpufleet_sweep_drain": False},
        inventory={"all": {"hosts": {
            "gpu1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                     "gpufleet_sweep_expected_gpus": 8},
            "cpu1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                     "gpufleet_sweep_expected_gpus": 0},
            "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}},
        envvars=installed_collection.ansible_env,
    )
    failures = [e["event_data"].get("res") for e in r.events if e["event"] == "runner_on_failed"]
    assert r.status == "successful", failures or r.stdout.read()[-4000:]
    stats = next(e for e in r.events if e["event"] == "playbook_on_stats")["event_data"]["artifact_data"]
    sweep = stats["gpufleet_health_sweep"]
    assert sweep["checked"] == 2 and sweep["not_probed"] == []
    assert sweep["verdicts"] == {"gpu1": "unhealthy", "cpu1": "healthy"}
    assert set(sweep["findings"]) == {"gpu1"}
    assert (sweep["findings"]["gpu1"]["code"], sweep["findings"]["gpu1"]["action"]) == ("nvml_missing", "reimage")
    assert "gpufleet_repair_plan" not in stats  # gpufleet_sweep_drain false: the policy was not asked
