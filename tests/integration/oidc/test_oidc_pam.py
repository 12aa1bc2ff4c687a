# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pam_python module through pamtester (and real sshd below): device and token modes."""
from __future__ import annotations

import json
import re

import pytest

from support.oidc_forge import claims_for, sign
from support.oidclab import AUD, PREFIX, approve, pamtester, real_token, write_config

pytestmark = pytest.mark.idp
ALICE, BOB, CAROL, DAVE = (f"{PREFIX}{n}" for n in ("alice", "bob", "carol", "dave"))
OK = "successfully authenticated"


def _url(prompt: str) -> str:
    m = re.search(r"open (\S+)", prompt)
    assert m, prompt
    return m.group(1)


@pytest.fixture
def svc(module_idp, pam_env, tmp_path):
    def make(mode: str, **over) -> str:
        cfg = write_config(tmp_path / f"oidc-{mode}-{len(pam_env.services)}.yml", module_idp.issuer,
                           tmp_path / "cache", **over)
        return pam_env.service(cfg, mode)

    return make


def device_login(service: str, user: str, approver: str | None, deny: bool = False):
    def answer(prompt: str) -> str:
        assert "Press Enter" in prompt and f"log in as {user}" in prompt
        if approver:
            assert approve(_url(prompt), approver, deny=deny) in ("Sign-in Success", "aborted")
        return ""

    return pamtester(service, user, answer)


def test_device_login_approved(svc, pam_env):
    rc, out = device_login(svc("device"), ALICE, ALICE)
    assert rc == 0 and OK in out, out + pam_env.log_text()
    assert f"accepted user={ALICE}" in pam_env.log_text()


@pytest.mark.parametrize("user,approver,deny,reason", [
    (ALICE, ALICE, True, "denied by the user"),
    (ALICE, BOB, False, f"token user '{BOB}' != login user '{ALICE}'"),
    (ALICE, CAROL, False, f"token user '{CAROL}' != login user '{ALICE}'"),
    (BOB, BOB, False, "not in any allowed group"),
])
def test_device_login_refused(svc, pam_env, user, approver, deny, reason):
    rc, out = device_login(svc("device"), user, approver, deny)
    assert rc != 0 and OK not in out
    assert reason in pam_env.log_text(), pam_env.log_text()


def test_device_login_timed_out(svc, pam_env):
    rc, out = device_login(svc("device", device_timeout=3), ALICE, None)
    assert rc != 0 and OK not in out
    assert "timed out" in pam_env.log_text()


def test_token_mode(svc, pam_env, module_idp, tmp_path):
    service = svc("token")
    at = real_token(module_idp.issuer, DAVE, tmp_path)  # 40 extra groups: a long real token
    assert len(at) > 1500
    rc, out = pamtester(service, DAVE, lambda p: at)
    assert rc == 0 and OK in out, out + pam_env.log_text()
    # the same token for another login user, and hostile tokens, all fail
    rc, out = pamtester(service, ALICE, lambda p: at)
    assert rc != 0 and "!= login user" in pam_env.log_text()
    priv = json.loads(module_idp.jwks_path.read_text())
    from support.oidc_forge import unsigned

    for tok, reason in ((unsigned(claims_for(module_idp.issuer, AUD, user=ALICE)), "algorithm not allowed"),
                        (sign(priv, claims_for(module_idp.issuer, "urn:x", user=ALICE)), "invalid claim: aud"),
                        ("not-a-token", "opaque or malformed")):
        rc, out = pamtester(service, ALICE, lambda p, t=tok: t)
        assert rc != 0 and OK not in out
        assert reason in pam_env.log_text()


def test_token_mode_idp_down_with_and_without_cache(pam_env, idp_factory, tmp_path):
    idp = idp_factory(name="downidp")
    at = real_token(idp.issuer, ALICE, tmp_path)
    service = pam_env.service(write_config(tmp_path / "down.yml", idp.issuer, tmp_path / "pamcache"), "token")
    rc, out = pamtester(service, ALICE, lambda p: at)
    assert rc == 0 and OK in out, out + pam_env.log_text()  # fills the cache
    idp.stop()
    rc, out = pamtester(service, ALICE, lambda p: at)
    assert rc == 0 and OK in out, out + pam_env.log_text()  # IdP down, cached keys
    empty = pam_env.service(write_config(tmp_path / "empty.yml", idp.issuer, tmp_path / "emptycache"), "token")
    rc, out = pamtester(empty, ALICE, lambda p: at)
    assert rc != 0 and "Authentication service cannot retrieve authentication info" in out, out
    assert "no usable signing keys" in pam_env.log_text()
    device = pam_env.service(write_config(tmp_path / "dev.yml", idp.issuer, tmp_path / "emptycache"), "device")
    rc, out = pamtester(device, ALICE, lambda p: "")
    assert rc != 0 and "Authentication service cannot retrieve authentication info" in out, out
