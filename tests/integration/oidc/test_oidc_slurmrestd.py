# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurmrestd with auth/jwt and the test IdP's JWKS, in a Slurm lab instance of this module's own.

roles/slurm_rest_jwt is applied into a temporary root to produce the normalised JWKS and the
slurm.conf settings; a lab (tests/lab/slurm-lab.sh, own port base and directory, 2 nodes) then runs
slurmctld + slurmrestd on that JWKS, on the release of the lane (SLURM_LAB_RELEASE: 22.05 on the host,
24.11 in the trixie chroot, which sees the host's users). Real IdP ID tokens (device grant) for a local user
are accepted on the diag endpoint - an RPC slurmctld answers only for an authenticated user (24.11's ping
answers 200 with "pinged": "DOWN" whatever the token, so ping proves nothing); a forged one (other key, same
kid), an expired one and a token presented under another user name are refused.

Every slurmctld log line is read for the request that caused it. The line "initial jwt_decode failure:
Invalid argument" comes from the RFC 9068 access token (typ at+jwt, refused by 22.05's libjwt) sent later in
the same test; it was once read as a refusal of a valid ID token, and the test retried ID tokens for it.
No valid token was ever refused (libjwt 1.10.2 + Slurm's JWKS-to-PEM conversion, thousands of tokens and
hundreds of keys): every fresh ID token must be accepted, the first time.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support.labs import LAB_SCRIPT, reserve
from support.oidc_forge import claims_for, make_private_jwks, sign
from support.oidclab import PLAYBOOK, PREFIX, REPO, real_token

pytestmark = [pytest.mark.idp, pytest.mark.lab]
ALICE, DAVE = f"{PREFIX}alice", f"{PREFIX}dave"
RELEASE = os.environ.get("SLURM_LAB_RELEASE", "22.05")
# diag needs slurmctld to accept the token: 22.05 answers 500 and 24.11 511 when auth/jwt refuses it.
DIAG = "/slurm/v0.0.38/diag" if RELEASE == "22.05" else "/slurm/v0.0.40/diag"
ID_TOKENS = 2  # fresh ID tokens (other iat/exp, so other bytes and signatures), each must be accepted


def _scontrol(lab_dir: Path) -> str:
    """This lab's own scontrol: the host's for 22.05, the lab's chroot wrapper for 24.11 (never the lane's main
    lab, whose SLURM_CONF and wrapper directory the session fixture exports)."""
    return "/usr/bin/scontrol" if RELEASE == "22.05" else f"{lab_dir}/bin/wrap/scontrol"


def _apply_role(root: Path, issuer: str, lab_dir: Path) -> subprocess.CompletedProcess:
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
             "slurm_rest_jwt_reconfigure_command": f"env SLURM_CONF={lab_dir}/etc/slurm.conf {_scontrol(lab_dir)} "
                                                   "reconfigure"}
    (root / "play.yml").write_text(yaml.safe_dump(play))
    (root / "vars.json").write_text(json.dumps(extra))
    return subprocess.run([str(PLAYBOOK), "-i", "localhost,", str(root / "play.yml"), "-e", f"@{root / 'vars.json'}"],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO), check=False)


@pytest.fixture(scope="module")
def block():
    """A port block and lab directory of this module's own, from the lab factory."""
    res = reserve("the OIDC slurmrestd lab", nodes=2)
    yield res
    res.release()


def _lab(block, cmd: str, jwks: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    env = block.script_env(2, RELEASE, SLURM_LAB_HEALTHCHECK_INTERVAL="0")
    if jwks:
        env["SLURM_LAB_JWKS"] = str(jwks)
    return subprocess.run(["bash", str(LAB_SCRIPT), cmd], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def jwt_lab(block, module_idp, local_users, tmp_path_factory):
    # local_users first: the 24.11 chroot gets the host's users when the lab starts.
    root = tmp_path_factory.mktemp("slurmroot")
    r = _apply_role(root, module_idp.issuer, block.dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    r = _lab(block, "start", root / "etc/slurm/jwks.json")
    try:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        yield root, block.base + 20
    finally:
        _lab(block, "stop", timeout=120)


def _rest(port: int, user: str, token: str, path: str = DIAG) -> tuple[int, str]:
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


def _accepted(status: int, body: str) -> bool:
    if status != 200:
        return False
    try:
        return isinstance(json.loads(body).get("statistics"), dict)
    except ValueError:
        return False


class _CtldLog:
    """slurmctld's log from a mark on: the lines one request caused."""

    def __init__(self, lab_dir: Path):
        self.path = lab_dir / "log" / "slurmctld.log"
        self.mark = 0

    def start(self) -> None:
        self.mark = self.path.stat().st_size

    def new(self) -> str:
        with open(self.path, "rb") as fh:
            fh.seek(self.mark)
            return fh.read().decode(errors="replace")


JWT_ERRORS = ("jwt_decode failure", "failed to verify jwt", "could not find matching kid", "token expired",
              "alternate user", "auth_p_verify")


def test_slurmrestd_accepts_idp_token_and_rejects_forged(jwt_lab, block, module_idp, local_users, tmp_path):
    _root, port = jwt_lab
    log = _CtldLog(block.dir)
    # The IdP's ID tokens (header without typ, RS256, kid rs-1, sun=<user>: Slurm's default user claim): every one
    # is accepted at once, and slurmctld logs no auth/jwt error for it.
    for attempt in range(ID_TOKENS):
        idt = real_token(module_idp.issuer, ALICE, tmp_path, kind="id_token", scope="openid profile groups slurm ssh")
        header = json.loads(base64.urlsafe_b64decode(idt.split(".")[0] + "=="))
        assert header == {"alg": "RS256", "kid": "rs-1"}, header
        log.start()
        status, body = _rest(port, ALICE, idt)
        assert _accepted(status, body), (attempt, status, body[:500], idt)
        errors = [line for line in log.new().splitlines() if any(e in line for e in JWT_ERRORS)]
        assert errors == [], (attempt, errors)
    # RFC 9068 access tokens carry typ "at+jwt": the same IdP key, the same claims. 22.05's libjwt 1.10 refuses
    # any typ other than JWT at decode - this request is where "initial jwt_decode failure: Invalid argument"
    # comes from; 24.11's libjwt 1.17 no longer checks typ (see docs/oidc.md).
    at = real_token(module_idp.issuer, ALICE, tmp_path)
    assert json.loads(base64.urlsafe_b64decode(at.split(".")[0] + "=="))["typ"] == "at+jwt"
    log.start()
    status, body = _rest(port, ALICE, at)
    if RELEASE == "22.05":
        assert not _accepted(status, body)
        assert "initial jwt_decode failure: Invalid argument" in log.new()
    else:
        assert _accepted(status, body), (status, body[:500])
    priv = json.loads(module_idp.jwks_path.read_text())
    plain = sign(priv, claims_for(module_idp.issuer, "urn:gpufleet:ssh", user=ALICE, sun=ALICE), "rs-1",
                 header={"typ": "JWT"})
    status, body = _rest(port, ALICE, plain)
    assert _accepted(status, body), (status, body[:500])
    # alice's ID token presented under another user name
    log.start()
    status, body = _rest(port, DAVE, idt)
    assert not _accepted(status, body)
    assert "alternate user" in log.new()
    # forged: right kid, typ JWT, signed with another key
    log.start()
    forged = sign(make_private_jwks(3), claims_for(module_idp.issuer, "urn:gpufleet:ssh", user=ALICE, sun=ALICE),
                  "rs-3", header={"kid": "rs-1", "typ": "JWT"})
    status, body = _rest(port, ALICE, forged)
    assert not _accepted(status, body)
    text = log.new()
    assert "could not find matching kid or decode failed" in text or "failed to verify jwt" in text, text
    # expired, signed with the real key
    log.start()
    now = int(time.time())
    expired = sign(priv, claims_for(module_idp.issuer, "urn:gpufleet:ssh", user=ALICE, sun=ALICE, exp=now - 60,
                                    iat=now - 700), "rs-1", header={"typ": "JWT"})
    status, body = _rest(port, ALICE, expired)
    assert not _accepted(status, body)
    assert "token expired" in log.new()


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
