# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Against the real test IdP: device grant, real tokens through the CLI, outage, rotation, kid storm."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.oidc_forge import claims_for, make_private_jwks, sign
from support.oidclab import AUD, PREFIX, approve, approve_later, real_token, write_config

pytestmark = pytest.mark.idp
CLI = str(Path(sys.prefix) / "bin" / "gpufleet-oidc")
ALICE = f"{PREFIX}alice"


def cli(config: Path, token: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "validate", "--config", str(config), *extra], input=token, capture_output=True,
                          text=True, timeout=60, check=False)


def _authenticator(cfgpath):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import load_config
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.core import Authenticator

    return Authenticator(load_config(str(cfgpath)))


def test_discovery_and_device_grant_real_token(module_idp, tmp_path):
    cfg = write_config(tmp_path / "c.yml", module_idp.issuer, tmp_path / "cache")
    auth = _authenticator(cfg)
    meta = auth.keys.metadata()
    assert meta["issuer"] == module_idp.issuer and meta["device_authorization_endpoint"].endswith("/device/auth")
    dg = auth.device_grant()
    grant = dg.start()
    assert grant["interval"] == 1 and grant["user_code"] in grant["verification_uri_complete"]
    t = approve_later(grant["verification_uri_complete"], ALICE)
    tokens = dg.poll(grant, 20, first_delay=0)
    t.join(10)
    at = tokens["access_token"]
    r = cli(cfg, at)
    assert (r.returncode, r.stdout.strip()) == (0, ALICE), r.stderr
    claims = json.loads(cli(cfg, at, "--claims").stdout.splitlines()[1])
    assert claims["aud"] == AUD and claims["iss"] == module_idp.issuer and "hpc-users" in claims["groups"]
    assert dg.polls >= 1
    # the ID token validates too, with aud = client_id and the azp check
    idcfg = write_config(tmp_path / "id.yml", module_idp.issuer, tmp_path / "cache", audience="gpufleet-device",
                         allowed_azp=["gpufleet-device"], validate_token="id_token")
    r = cli(idcfg, tokens["id_token"])
    assert (r.returncode, r.stdout.strip()) == (0, ALICE), r.stderr


def test_device_grant_denied_and_timeout(module_idp, tmp_path):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import DeviceFlowError

    auth = _authenticator(write_config(tmp_path / "c.yml", module_idp.issuer, tmp_path / "cache"))
    dg = auth.device_grant()
    grant = dg.start()
    assert approve(grant["verification_uri_complete"], ALICE, deny=True) == "aborted"
    with pytest.raises(DeviceFlowError, match="denied"):
        dg.poll(grant, 20)
    dg = auth.device_grant()
    grant = dg.start()
    with pytest.raises(DeviceFlowError, match="timed out"):
        dg.poll(grant, 2.5)
    assert dg.polls >= 2


def test_device_grant_slow_down(idp_factory, tmp_path):
    idp = idp_factory(IDP_SLOW_DOWN=1)
    auth = _authenticator(write_config(tmp_path / "c.yml", idp.issuer, tmp_path / "cache"))
    dg = auth.device_grant()
    grant = dg.start()
    approve(grant["verification_uri_complete"], ALICE)
    tokens = dg.poll(grant, 30)
    assert tokens["access_token"]
    assert dg.interval == grant["interval"] + 5  # RFC 8628 3.5: +5 s after slow_down
    assert dg.polls == 2


def test_hostile_tokens_through_cli_with_logged_reason(module_idp, tmp_path):
    cfg = write_config(tmp_path / "c.yml", module_idp.issuer, tmp_path / "cache")
    priv = json.loads(module_idp.jwks_path.read_text())
    iss = module_idp.issuer
    from support.oidc_forge import encrypted, hs256_with_public_pem, padded_to, tamper_payload, unsigned

    good = sign(priv, claims_for(iss, AUD, user=ALICE))
    assert cli(cfg, good).returncode == 0
    import time as _t
    now = int(_t.time())
    cases = {
        "expired": (sign(priv, claims_for(iss, AUD, user=ALICE, exp=now - 3600, iat=now - 7200)), "expired"),
        "nbf future": (sign(priv, claims_for(iss, AUD, user=ALICE, nbf=now + 3600)), "not yet valid"),
        "wrong iss": (sign(priv, claims_for(iss + "/x", AUD, user=ALICE)), "invalid claim: iss"),
        "wrong aud": (sign(priv, claims_for(iss, "urn:other", user=ALICE)), "invalid claim: aud"),
        "alg none": (unsigned(claims_for(iss, AUD, user=ALICE)), "algorithm not allowed"),
        "hs256 pem": (hs256_with_public_pem(priv, claims_for(iss, AUD, user=ALICE)), "algorithm not allowed"),
        "unknown kid": (sign(make_private_jwks(4), claims_for(iss, AUD, user=ALICE), "rs-4"), "unknown signing key"),
        "tampered": (tamper_payload(good, groups=["hpc-users", "admins"]), "bad signature"),
        "oversize": (padded_to(priv, claims_for(iss, AUD, user=ALICE), 17000), "too large"),
        "jwe": (encrypted(priv, claims_for(iss, AUD, user=ALICE)), "JWE"),
        "missing sub": (sign(priv, {k: v for k, v in claims_for(iss, AUD, user=ALICE).items() if k != "sub"}),
                        "missing required claim: sub"),
    }
    for name, (tok, reason) in cases.items():
        r = cli(cfg, tok)
        assert r.returncode != 0 and r.stdout == "", name
        assert reason in r.stderr, (name, r.stderr)


def test_idp_down_with_cache_then_without(idp_factory, tmp_path):
    idp = idp_factory()
    cfg = write_config(tmp_path / "c.yml", idp.issuer, tmp_path / "cache")
    at = real_token(idp.issuer, ALICE, tmp_path)
    assert cli(cfg, at).returncode == 0  # fills the cache
    idp.stop()
    r = cli(cfg, at)
    assert (r.returncode, r.stdout.strip()) == (0, ALICE), r.stderr  # IdP down, cache fresh
    shutil.rmtree(tmp_path / "cache")
    r = cli(cfg, at)
    assert r.returncode == 5 and r.stdout == "" and "no usable signing keys" in r.stderr


def test_idp_down_stale_cache_within_max_stale(idp_factory, tmp_path):
    idp = idp_factory()
    cfg = write_config(tmp_path / "c.yml", idp.issuer, tmp_path / "cache", jwks_ttl=1, max_stale=3600)
    at = real_token(idp.issuer, ALICE, tmp_path)
    assert cli(cfg, at).returncode == 0
    idp.stop()
    _age_cache(tmp_path / "cache", 120)
    r = cli(cfg, at)
    assert r.returncode == 0 and "using cached keys" in r.stderr, r.stderr


def _age_cache(cache_dir: Path, seconds: int) -> None:
    for p in cache_dir.glob("issuer-*.json"):
        d = json.loads(p.read_text())
        for k in ("jwks_fetched_at", "refresh_attempt_at", "metadata_fetched_at"):
            d[k] -= seconds
        p.write_text(json.dumps(d))


def test_key_rotation_picked_up_and_no_storm(idp_factory, tmp_path):
    gen1 = make_private_jwks(1)
    idp = idp_factory(gen1, name="gen1")
    cfg = write_config(tmp_path / "c.yml", idp.issuer, tmp_path / "cache", min_refresh_interval=30)
    t1 = real_token(idp.issuer, ALICE, tmp_path)
    assert cli(cfg, t1).returncode == 0
    # Forged kids right after the fetch: rejected, and the IdP sees no JWKS request at all.
    jwks_hits = idp.hits("/jwks")
    for i in range(5):
        r = cli(cfg, sign(make_private_jwks(50 + i), claims_for(idp.issuer, AUD, user=ALICE), f"rs-{50 + i}"))
        assert r.returncode == 3 and "unknown signing key" in r.stderr
    assert idp.hits("/jwks") == jwks_hits
    # Rotation: the IdP restarts on the same port with generation-2 keys.
    port = idp.issuer.rsplit(":", 1)[1]
    idp.stop()
    gen2 = make_private_jwks(2)
    idp2 = idp_factory(gen2, name="gen2", IDP_PORT=port)
    assert idp2.issuer == idp.issuer
    _age_cache(tmp_path / "cache", 60)  # the last refresh attempt is now older than min_refresh_interval
    t2 = sign(gen2, claims_for(idp2.issuer, AUD, user=ALICE), "rs-2")
    r = cli(cfg, t2)
    assert (r.returncode, r.stdout.strip()) == (0, ALICE), r.stderr
    assert idp2.hits("/jwks") == 1 and "JWKS refreshed" in r.stderr
    # and right after the rotation, forged kids again cost nothing
    for i in range(3):
        assert cli(cfg, sign(make_private_jwks(60 + i), claims_for(idp2.issuer, AUD, user=ALICE),
                             f"rs-{60 + i}")).returncode == 3
    assert idp2.hits("/jwks") == 1
