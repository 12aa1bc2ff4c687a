# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""AWX / AAP readiness: ansible-builder turns execution-environment.yml (with the collection built from this
checkout) into a build context; the playbooks never prompt; the AWX objects file is valid YAML naming them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def test_ansible_builder_create(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=300)
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    assert (dist / f"gpufleet-reliability-{version}.tar.gz").exists()
    shutil.copy(REPO / "execution-environment.yml", tmp_path / "execution-environment.yml")
    proc = subprocess.run([str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "-c", "context"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ctx = tmp_path / "context"
    containerfile = next(p for p in (ctx / "Containerfile", ctx / "Dockerfile") if p.exists())
    text = containerfile.read_text()
    assert "ansible-galaxy collection install" in text and "ansible-core==2.19.14" in text
    reqs = yaml.safe_load((ctx / "_build" / "requirements.yml").read_text())
    assert reqs["collections"][0]["type"] == "file"
    assert (ctx / "_build" / "dist" / f"gpufleet-reliability-{version}.tar.gz").exists()
    ee_meta = yaml.safe_load((REPO / "meta" / "execution-environment.yml").read_text())
    assert ee_meta["version"] == 1
    for key in ("python", "system"):
        assert (REPO / ee_meta["dependencies"][key]).exists()


def test_playbooks_never_prompt():
    for pb in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(pb.read_text()) or []:
            assert "vars_prompt" not in play, f"{pb.name}: vars_prompt makes AWX jobs hang"
            assert "pause" not in str(play.get("tasks", "")), f"{pb.name}: pause prompts"


def test_awx_objects_describe_templates_and_workflow():
    plays = yaml.safe_load((REPO / "docs" / "awx" / "objects.yml").read_text())
    tasks = plays[0]["tasks"]
    templates = [t["awx.awx.job_template"] for t in tasks if "awx.awx.job_template" in t]
    assert {t["playbook"] for t in templates} == {"playbooks/repair.yml"}
    assert all((REPO / t["playbook"]).exists() for t in templates)
    wf = next(t["awx.awx.workflow_job_template"] for t in tasks if "awx.awx.workflow_job_template" in t)
    kinds = [n["unified_job_template"]["type"] for n in wf["workflow_nodes"]]
    assert kinds == ["job_template", "workflow_approval", "job_template"]
    names = {t["name"] for t in templates}
    assert {n["unified_job_template"]["name"] for n in wf["workflow_nodes"] if n["unified_job_template"]["type"]
            == "job_template"} <= names
