"""``gpufleet-oidc preflight``: what the oidc_login role runs on the node before it switches sshd and PAM. A real
IdP stand-in on loopback (discovery naming its own URL, a JWKS), genuine answers as controls, then the ways an IdP
can leave nobody able to log in: unreachable, no device endpoint, no key for the allowed algorithms, a discovery
document naming another issuer, hostile key ids, and a test token that does not validate."""
from __future__ import annotations

import os

import yaml

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import oidc as cli
from support.oidc_forge import AUD, claims_for, public_jwks, serve_routes, sign


def idp(private_jwks, keys=None, device=True, issuer=None):
    def routes(base):
        meta = {"issuer": issuer or base, "jwks_uri": base + "/jwks", "token_endpoint": base + "/token"}
        if device:
            meta["device_authorization_endpoint"] = base + "/device"
        return {"/.well-known/openid-configuration": meta,
                "/jwks": {"keys": keys if keys is not None else public_jwks(private_jwks)["keys"]}}
    return serve_routes(routes)


def run(capsys, tmp_path, base_conf, issuer, *argv, **over):
    path = tmp_path / "oidc.yml"
    path.write_text(yaml.safe_dump(dict(base_conf, issuer=issuer, **over)))
    rc = cli.main(["preflight", "--config", str(path), *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_reachable_idp_with_keys_passes_and_a_test_token_maps(capsys, tmp_path, base_conf, private_jwks):
    with idp(private_jwks) as base:
        rc, out, err = run(capsys, tmp_path, base_conf, base)
        assert rc == 0 and out.startswith(f"ok: discovery and JWKS of {base} reached") and "kid rs-1" in out, err
        token = tmp_path / "token"
        token.write_text(sign(private_jwks, claims_for(base, AUD, user="alice")) + "\n")
        rc, out, err = run(capsys, tmp_path, base_conf, base, "--token-file", str(token), "--user", "alice")
        assert rc == 0 and "ok: the test token is valid and maps to alice" in out, err
        # the node's own key cache is not touched before the switch: a scratch one was used
        assert not os.path.exists(base_conf["jwks_cache_dir"])


def test_an_unreachable_issuer_is_refused(capsys, tmp_path, base_conf):
    rc, out, err = run(capsys, tmp_path, base_conf, "http://127.0.0.1:9")
    assert rc == 5 and out == "" and "gpufleet-oidc: rejected: cannot reach http://127.0.0.1:9" in err


def test_device_mode_needs_the_device_endpoint(capsys, tmp_path, base_conf, private_jwks):
    with idp(private_jwks, device=False) as base:
        rc, out, err = run(capsys, tmp_path, base_conf, base)
        assert rc == 5 and "no device_authorization_endpoint" in err and out == ""
        rc, out, err = run(capsys, tmp_path, base_conf, base, "--mode", "token")
        assert rc == 0, err


def test_no_key_for_the_allowed_algorithms_is_refused(capsys, tmp_path, base_conf, private_jwks):
    ec_only = [k for k in public_jwks(private_jwks)["keys"] if k["kty"] == "EC"]
    with idp(private_jwks, keys=ec_only) as base:
        rc, out, err = run(capsys, tmp_path, base_conf, base, algorithms=["RS256"])
        assert rc == 5 and "has no key for the allowed algorithms (RS256)" in err and out == ""
        rc, out, err = run(capsys, tmp_path, base_conf, base, algorithms=["RS256", "ES256"])
        assert rc == 0 and "1 key(s)" in out, err
    with idp(private_jwks, keys=[]) as base:
        rc, _out, err = run(capsys, tmp_path, base_conf, base)
        assert rc == 5 and "no key for the allowed algorithms" in err


def test_hostile_answers(capsys, tmp_path, base_conf, private_jwks):
    # a discovery document that names another issuer
    with idp(private_jwks, issuer="https://evil.example") as base:
        rc, out, err = run(capsys, tmp_path, base_conf, base)
        assert rc == 5 and "discovery issuer 'https://evil.example'" in err and out == ""
    # key ids with terminal control characters are shown stripped
    keys = [dict(k, kid="rs-1\x1b[2J\x07\u202e") for k in public_jwks(private_jwks)["keys"] if k["kty"] == "RSA"]
    with idp(private_jwks, keys=keys) as base:
        rc, out, err = run(capsys, tmp_path, base_conf, base)
        assert rc == 0 and "\x1b" not in out and "\x07" not in out and "\u202e" not in out, err
    # a test token for another audience, or another user, fails the preflight with the validator's reason
    with idp(private_jwks) as base:
        token = tmp_path / "token"
        token.write_text(sign(private_jwks, claims_for(base, "urn:other")))
        rc, out, err = run(capsys, tmp_path, base_conf, base, "--token-file", str(token))
        assert rc == 3 and "invalid claim: aud" in err and "test token" not in out
        token.write_text(sign(private_jwks, claims_for(base, AUD, user="alice")))
        rc, out, err = run(capsys, tmp_path, base_conf, base, "--token-file", str(token), "--user", "bob")
        assert rc == 4 and "!= login user" in err
        rc, out, err = run(capsys, tmp_path, base_conf, base, "--token-file", str(tmp_path / "missing"))
        assert rc == 2 and "--token-file: cannot read" in err
