# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurmrestd with auth/jwt and the test IdP's JWKS, in a Slurm lab instance of this module's own.

roles/slurm_rest_jwt is applied into a temporary root to produce the normalised JWKS and the
slurm.conf settings; a lab (tests/lab/slurm-lab.sh, own port base and directory, 2 nodes) then runs
slurmctld + slurmrestd on that JWKS. A real IdP access token (device grant) for a local user is
accepted on /slurm/v0.0.38/ping; a forged one (other key, same kid), an expired one and a token
presented under another user name are refused.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from oidc_forge import claims_for, make_private_jwks, sign
from oidclab import PLAYBOOK, PREFIX, REPO, real_token

pytestmark = [pytest.mark.idp, pytest.mark.lab]
ALICE, DAVE = f"{PREFIX}alice", f"{PREFIX}dave"
LAB_SCRIPT = REPO / "tests" / "lab" / "slurm-lab.sh"
# This module's lab always runs the host's Slurm 22.05, also in the 24.11 lane (SLURM_LAB_RELEASE=24.11): the
# test users exist on the host only, not inside the trixie chroot, and a first try in that lane showed 24.11's
# /slurm/v0.0.40/ping answering 200 whatever the token, so it needs its own endpoint choice (not done yet).
RELEASE = "22.05"
PORT_BASE = int(os.environ.get("OIDC_SLURM_LAB_PORT_BASE", "17650"))
LAB_DIR = Path(os.environ.get("OIDC_SLURM_LAB_DIR", f"/tmp/gpufleet-lab-oidc-{RELEASE}-{PORT_BASE}"))
PING = "/slurm/v0.0.38/ping"


def _apply_role(root: Path, issuer: str) -> subprocess.CompletedProcess:
    import yaml

    (root / "etc/slurm").mkdir(parents=True, exist_ok=True)
    (root / "etc/slurm/slurm.conf").write_text("# test slurm.conf\nClusterName=oidctest\nAuthType=auth/munge\n")
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             "roles": [{"role": "gpufleet.reliability.slurm_rest_jwt"}]}]
    extra = {"slurm_rest_jwt_issuer": issuer, "slurm_rest_jwt_jwks_path": str(root / "etc/slurm/jwks.json"),
             "slurm_rest_jwt_jwks_owner": "", "slurm_rest_jwt_jwks_group": "",
             "slurm_rest_jwt_slurm_conf": str(root / "etc/slurm/slurm.conf"),
             "slurm_rest_jwt_install_packages": False, "slurm_rest_jwt_create_restd_user": False,
             "slurm_rest_jwt_manage_services": False, "slurm_rest_jwt_systemd_dir": str(root / "systemd"),
             "slurm_rest_jwt_lib_dir": str(root / "opt/gpufleet-oidc/lib"),
             "slurm_rest_jwt_refresh_script": str(root / "sbin/gpufleet-slurm-jwks-refresh"),
             # the system interpreter: the refresh needs neither authlib nor joserfc
             "slurm_rest_jwt_python": "/usr/bin/python3",
             # This lab is always the host's 22.05: its own scontrol, never the 24.11 lane's wrappers first on PATH.
             "slurm_rest_jwt_reconfigure_command":
                 f"env SLURM_CONF={LAB_DIR}/etc/slurm.conf /usr/bin/scontrol reconfigure"}
    (root / "play.yml").write_text(yaml.safe_dump(play))
    (root / "vars.json").write_text(json.dumps(extra))
    return subprocess.run([str(PLAYBOOK), "-i", "localhost,", str(root / "play.yml"), "-e", f"@{root / 'vars.json'}"],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO), check=False)


def _lab(cmd: str, jwks: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, SLURM_LAB_PORT_BASE=str(PORT_BASE), SLURM_LAB_DIR=str(LAB_DIR), SLURM_LAB_NODES="2",
               SLURM_LAB_HEALTHCHECK_INTERVAL="0", SLURM_LAB_RELEASE=RELEASE)
    if jwks:
        env["SLURM_LAB_JWKS"] = str(jwks)
    return subprocess.run(["bash", str(LAB_SCRIPT), cmd], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def jwt_lab(module_idp, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurmroot")
    r = _apply_role(root, module_idp.issuer)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    r = _lab("start", root / "etc/slurm/jwks.json")
    try:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        yield root, PORT_BASE + 20
    finally:
        _lab("stop", timeout=120)


def _rest(port: int, user: str, token: str, path: str = PING) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 20
    while True:
        try:
            with opener.open(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_role_output(jwt_lab):
    root, _port = jwt_lab
    jwks = json.loads((root / "etc/slurm/jwks.json").read_text())
    assert [k["kid"] for k in jwks["keys"]] == ["rs-1"]  # the ES256 key is dropped, alg set
    assert jwks["keys"][0]["alg"] == "RS256" and oct(os.stat(root / "etc/slurm/jwks.json").st_mode & 0o777) == "0o400"
    conf = (root / "etc/slurm/slurm.conf").read_text()
    assert "AuthAltTypes=auth/jwt" in conf and f"AuthAltParameters=jwks={root}/etc/slurm/jwks.json" in conf
    dropin = (root / "systemd/slurmrestd.service.d/gpufleet-jwt.conf").read_text()
    assert "SLURM_JWT=daemon" in dropin and "-a rest_auth/jwt" in dropin and "-u slurmrestd" in dropin


def test_slurmrestd_accepts_idp_token_and_rejects_forged(jwt_lab, module_idp, local_users, tmp_path):
    _root, port = jwt_lab
    # The IdP's ID token (header without typ, RS256, sun=<user>: Slurm's default user claim) is accepted.
    # Seen once in a CI rehearsal (not reproduced in 8 tries since): slurmctld logged "initial jwt_decode
    # failure: Invalid argument" for a valid ID token. Until that libjwt 1.10 quirk is understood, a fresh token
    # (new iat/exp, so other bytes) is tried up to three times; Slurm must accept one of them.
    refused = []
    for _attempt in range(3):
        idt = real_token(module_idp.issuer, ALICE, tmp_path, kind="id_token", scope="openid profile groups slurm ssh")
        status, body = _rest(port, ALICE, idt)
        if status == 200:
            break
        refused.append((idt, body))
        time.sleep(1.1)
    assert status == 200, refused
    if refused:
        print(f"slurmrestd refused {len(refused)} valid ID token(s) before accepting one: {refused}")
    assert json.loads(body).get("pings"), body
    # RFC 9068 access tokens carry typ "at+jwt", which Slurm 22.05's libjwt refuses (it wants typ JWT):
    # the same IdP key, the same claims, still rejected (see docs/oidc.md).
    at = real_token(module_idp.issuer, ALICE, tmp_path)
    assert json.loads(__import__("base64").urlsafe_b64decode(at.split(".")[0] + "=="))["typ"] == "at+jwt"
    status, _body = _rest(port, ALICE, at)
    assert status != 200
    priv = json.loads(module_idp.jwks_path.read_text())
    plain = sign(priv, claims_for(module_idp.issuer, "urn:gpufleet:ssh", user=ALICE, sun=ALICE), "rs-1",
                 header={"typ": "JWT"})
    status, body = _rest(port, ALICE, plain)
    assert status == 200, body
    log_path = LAB_DIR / "log" / "slurmctld.log"

    def new_log(before: int) -> str:
        return log_path.read_text(errors="replace")[before:]

    # alice's ID token presented under another user name
    mark = len(log_path.read_text(errors="replace"))
    status, _body = _rest(port, DAVE, idt)
    assert status != 200
    assert "alternate user" in new_log(mark)
    # forged: right kid, typ JWT, signed with another key
    mark = len(log_path.read_text(errors="replace"))
    forged = sign(make_private_jwks(3), claims_for(module_idp.issuer, "urn:gpufleet:ssh", user=ALICE, sun=ALICE),
                  "rs-3", header={"kid": "rs-1", "typ": "JWT"})
    status, _body = _rest(port, ALICE, forged)
    assert status != 200
    text = new_log(mark)
    assert "could not find matching kid or decode failed" in text or "failed to verify jwt" in text
    # expired, signed with the real key
    mark = len(log_path.read_text(errors="replace"))
    now = int(time.time())
    expired = sign(priv, claims_for(module_idp.issuer, "urn:gpufleet:ssh", user=ALICE, sun=ALICE, exp=now - 60,
                                    iat=now - 700), "rs-1", header={"typ": "JWT"})
    status, _body = _rest(port, ALICE, expired)
    assert status != 200
    assert "token expired" in new_log(mark)


def test_refresh_timer_script(jwt_lab):
    root, _port = jwt_lab
    script = root / "sbin/gpufleet-slurm-jwks-refresh"
    assert subprocess.run(["shellcheck", str(script)], capture_output=True, check=False).returncode == 0
    timer = (root / "systemd/gpufleet-slurm-jwks.timer").read_text()
    assert "OnUnitActiveSec=1h" in timer
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "keys unchanged" in r.stdout, r.stdout + r.stderr
    jwks = root / "etc/slurm/jwks.json"
    before = jwks.read_text()
    jwks.unlink()
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "keys changed" in r.stdout, r.stdout + r.stderr  # and scontrol reconfigure ran
    assert json.loads(jwks.read_text()) == json.loads(before)
    assert oct(os.stat(jwks).st_mode & 0o777) == "0o400"
