# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A playbook smoke through ansible-runner, on whichever ansible-core runs the tests.

`make integration` runs it on ansible-core 2.19 (.venv), `make test-221` on 2.21 (.venv-221): the playbooks
pass --syntax-check, and a play applies roles/slurm_rest_jwt for real into a temporary root - the slurm_jwks and
slurm_conf modules, templates, copies and handlers - against a JWKS served on loopback: --check --diff first
(nothing written), then for real, then again with nothing changed.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import ansible_runner
import pytest
import yaml
from ansible.release import __version__ as ANSIBLE_CORE

from support.oidc_forge import make_private_jwks, public_jwks, serve_json

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ansible  # runs real Ansible: in the 2.21 lane too (make unit-221)


@pytest.fixture
def jwks_server():
    """A loopback HTTP server for one JWKS: two RSA keys, an EC key and an RSA key without kid."""
    keys = public_jwks(make_private_jwks(1))["keys"] + public_jwks(make_private_jwks(2))["keys"]
    nokid = dict([k for k in keys if k["kty"] == "RSA"][0])
    nokid.pop("kid")
    with serve_json({"keys": keys + [nokid]}) as url:
        yield url


@pytest.fixture(autouse=True)
def _this_ansible_first(monkeypatch):
    """ansible-runner starts ansible-playbook from PATH: the one next to the interpreter running the tests."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def _run(tmp_path: Path, project: dict, playbook: str, extravars: dict | None = None, cmdline: str | None = None):
    """One ansible-runner run in a private data dir of its own (runner keeps cmdline and extravars in env/)."""
    pdd = Path(tempfile.mkdtemp(prefix="runner-", dir=tmp_path))
    (pdd / "project").mkdir()
    for name, text in project.items():
        (pdd / "project" / name).write_text(text)
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook=playbook, quiet=True, extravars=extravars or {}, cmdline=cmdline,
        inventory={"all": {"hosts": {"node": {"ansible_connection": "local", "ansible_host": "localhost",
                                              "ansible_python_interpreter": sys.executable}}}},
        envvars={"ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"), "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False",
                 "ANSIBLE_ROLES_PATH": str(REPO / "roles")},
    )
    failures = [e["event_data"].get("res") for e in r.events if e["event"] == "runner_on_failed"]
    assert r.status == "successful" and r.rc == 0, failures or r.stdout.read()[-3000:]
    return r


def _changed(r) -> list:
    return [e["event_data"]["task"] for e in r.events
            if e["event"] in ("runner_on_ok", "runner_item_on_ok") and e["event_data"]["res"].get("changed")]


@pytest.mark.parametrize("playbook", sorted(p.name for p in (REPO / "playbooks").glob("*.yml")))
def test_playbooks_pass_syntax_check(tmp_path, playbook):
    _run(tmp_path, {playbook: (REPO / "playbooks" / playbook).read_text()}, playbook, cmdline="--syntax-check")


def test_role_check_then_apply_then_unchanged(tmp_path, jwks_server):
    root = tmp_path / "root"
    (root / "etc/slurm").mkdir(parents=True)
    conf = root / "etc/slurm/slurm.conf"
    conf.write_text("# site slurm.conf\nClusterName=smoke\nAuthType=auth/munge\n")
    play = [{"name": "smoke", "hosts": "node", "gather_facts": False, "tasks": [
        {"name": "The ansible-core of this run", "ansible.builtin.assert": {
            "that": [f"ansible_version.full == '{ANSIBLE_CORE}'"], "quiet": True}},
        {"name": "Apply slurm_rest_jwt", "ansible.builtin.include_role": {
            "name": "gpufleet.reliability.slurm_rest_jwt"}},
    ]}]
    project = {"site.yml": yaml.safe_dump(play)}
    extravars = {
        "slurm_rest_jwt_jwks_uri": jwks_server, "slurm_rest_jwt_jwks_path": str(root / "etc/slurm/jwks.json"),
        "slurm_rest_jwt_jwks_owner": "", "slurm_rest_jwt_jwks_group": "", "slurm_rest_jwt_slurm_conf": str(conf),
        "slurm_rest_jwt_install_packages": False, "slurm_rest_jwt_create_restd_user": False,
        "slurm_rest_jwt_manage_services": False, "slurm_rest_jwt_systemd_dir": str(root / "systemd"),
        "slurm_rest_jwt_refresh_timer": False,  # its copies are the copy module again: kept short
    }
    before = conf.read_text()
    r = _run(tmp_path, project, "site.yml", extravars, cmdline="--check --diff")
    assert "Sync the IdP's JWKS, normalised for Slurm" in _changed(r)
    assert conf.read_text() == before and not (root / "etc/slurm/jwks.json").exists()

    r = _run(tmp_path, project, "site.yml", extravars)
    assert "Set AuthAltTypes and AuthAltParameters" in _changed(r)
    jwks = json.loads((root / "etc/slurm/jwks.json").read_text())
    # RSA keys with a kid only, alg RS256, sorted by kid: what Slurm's auth/jwt can use
    assert [(k["kid"], k["alg"], sorted(k)) for k in jwks["keys"]] == [
        (kid, "RS256", ["alg", "e", "kid", "kty", "n", "use"]) for kid in ("rs-1", "rs-2")]
    assert "AuthAltTypes=auth/jwt" in conf.read_text()

    r = _run(tmp_path, project, "site.yml", extravars)
    assert _changed(r) == []
