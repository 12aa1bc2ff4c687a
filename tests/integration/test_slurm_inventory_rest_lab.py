# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The slurm inventory plugin's AWX mode (source: rest): a real slurmrestd with auth/jwt and an RS256 JWKS.

This module runs its own 2-node lab (a block of its own from the lab factory; SLURM_REST_LAB_PORT_BASE asks for
one) with SLURM_LAB_JWKS, because the session lab has no slurmrestd. The token is minted here with joserfc.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from support.labs import running_lab

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
RELEASE = os.environ.get("SLURM_LAB_RELEASE", "22.05")
API = {"22.05": "v0.0.38", "24.11": "v0.0.42"}[RELEASE]
USER = "slurm"  # slurmrestd rejects root tokens; the Debian packages create this user


@pytest.fixture(scope="module")
def rest_lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("restlab")
    key = RSAKey.generate_key(2048, parameters={"kid": "lab-key-1", "use": "sig", "alg": "RS256"})
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
    base = os.environ.get("SLURM_REST_LAB_PORT_BASE")
    with running_lab("the slurmrestd inventory lab", nodes=2, release=RELEASE, base=int(base) if base else None,
                     SLURM_LAB_HEALTHCHECK_INTERVAL="0", SLURM_LAB_JWKS=str(jwks)) as lab:
        yield key, lab, tmp


def token(key, user=USER, ttl=600):
    now = int(time.time())
    return jwt.encode({"alg": "RS256", "kid": "lab-key-1"}, {"sun": user, "iat": now, "exp": now + ttl}, key)


def inventory(cfg, lab_dir=None):
    # a source that fails to parse is an error, never a warning and an empty inventory (Ansible's default)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
               ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="true")
    if lab_dir is not None and RELEASE == "24.11":  # this lab's chroot clients (slurm-lab.sh env)
        env["PATH"] = f"{lab_dir}/bin/wrap{os.pathsep}{env['PATH']}"
    return subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(cfg), "--list"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_rest_source_matches_cli_source(rest_lab):
    key, lab, tmp = rest_lab
    lab_dir = lab.dir
    rest = tmp / "rest.slurm.yml"
    rest.write_text(f"plugin: gpufleet.reliability.slurm\nsource: rest\n"
                    f"rest_url: http://127.0.0.1:{lab.port_base + 20}\n"
                    f"rest_api_version: {API}\nrest_user: {USER}\nrest_token: {token(key)}\n")
    cli = tmp / "cli.slurm.yml"
    cli.write_text(f"plugin: gpufleet.reliability.slurm\nslurm_conf: {lab_dir}/etc/slurm.conf\n")
    a, b = inventory(rest), inventory(cli, lab_dir)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert "node1" in ra["_meta"]["hostvars"] and "node2" in ra["_meta"]["hostvars"], a.stderr
    groups = {g: sorted(v.get("hosts", [])) for g, v in ra.items() if g.startswith("slurm_")}
    assert groups == {g: sorted(v.get("hosts", [])) for g, v in rb.items() if g.startswith("slurm_")}, \
        a.stderr + b.stderr
    assert groups["slurm_partition_gpu"] == ["node1", "node2"]


def test_rest_source_with_a_forged_token_fails_clearly(rest_lab):
    _key, lab, tmp = rest_lab
    forged = RSAKey.generate_key(2048, parameters={"kid": "lab-key-1", "use": "sig", "alg": "RS256"})
    cfg = tmp / "forged.slurm.yml"
    cfg.write_text(f"plugin: gpufleet.reliability.slurm\nsource: rest\n"
                   f"rest_url: http://127.0.0.1:{lab.port_base + 20}\n"
                   f"rest_api_version: {API}\nrest_user: {USER}\nrest_token: {token(forged)}\n")
    p = inventory(cfg)
    assert "slurm inventory: GET" in p.stderr and "failed" in p.stderr, p.stderr
    assert '"node1"' not in p.stdout
