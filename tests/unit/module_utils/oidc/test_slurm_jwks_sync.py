"""The JWKS sync for Slurm's auth/jwt (module_utils/oidc/slurm.py): what Slurm's key matching needs.

Slurm verifies a token with the first JWKS key whose kid matches and never tries another, so two RSA keys under
one kid are refused; a discovered jwks_uri must stay on the issuer's origin (the login's rule); keys whose kid is
not a string are dropped (Slurm fatal()s on a key without a usable kid). Genuine documents are the controls.
"""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import oidc as cli
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import transport
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import IdPUnavailable
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.slurm import (
    fetch_jwks,
    normalise_jwks_for_slurm,
)
from support.oidc_forge import make_private_jwks, public_jwks

ISSUER = "https://sso.example.com/realms/hpc"
DISCOVERY = ISSUER + "/.well-known/openid-configuration"


@pytest.fixture
def idp(monkeypatch):
    """transport.get_json answered from a dict; every URL asked for is recorded (nothing reaches the network)."""
    docs, calls = {}, []

    def get_json(url, timeout=5.0):
        calls.append(url)
        if url not in docs:
            raise IdPUnavailable(f"cannot reach {url}: test")
        return docs[url]

    monkeypatch.setattr(transport, "get_json", get_json)
    return docs, calls


def _rsa(generation: int) -> dict:
    return [k for k in public_jwks(make_private_jwks(generation))["keys"] if k["kty"] == "RSA"][0]


def test_two_keys_with_one_kid_are_refused_by_name():
    old, new = _rsa(1), _rsa(2)
    new["kid"] = old["kid"]
    with pytest.raises(IdPUnavailable, match=r"several RSA signing keys with kid 'rs-1'.*first key of a kid"):
        normalise_jwks_for_slurm({"keys": [old, new]})


def test_distinct_kids_are_kept_sorted_with_rs256():
    jwks = {"keys": [_rsa(2), _rsa(1)] + [k for k in public_jwks(make_private_jwks(3))["keys"] if k["kty"] == "EC"]}
    out = normalise_jwks_for_slurm(jwks)
    assert [(k["kid"], k["alg"]) for k in out["keys"]] == [("rs-1", "RS256"), ("rs-2", "RS256")]


@pytest.mark.parametrize("kid", [7, None, "", ["rs-1"], {"k": "rs-1"}])
def test_a_key_whose_kid_is_not_a_string_is_dropped(kid):
    bad = _rsa(1)
    bad["kid"] = kid
    out = normalise_jwks_for_slurm({"keys": [bad, _rsa(2)]})
    assert [k["kid"] for k in out["keys"]] == ["rs-2"]


@pytest.mark.parametrize("jwks_uri", [
    "https://evil.example/certs",
    "https://sso.example.com:8443/realms/hpc/certs",
    "http://127.0.0.1:8080/certs",
])
def test_discovered_jwks_uri_off_the_issuers_origin_is_refused_before_fetching(idp, jwks_uri):
    docs, calls = idp
    docs[DISCOVERY] = {"issuer": ISSUER, "jwks_uri": jwks_uri}
    docs[jwks_uri] = public_jwks(make_private_jwks(9))
    with pytest.raises(IdPUnavailable, match="leaves the issuer's origin"):
        fetch_jwks(issuer=ISSUER)
    assert calls == [DISCOVERY]  # the attacker's keys were never fetched


def test_discovered_jwks_uri_on_the_issuers_origin_is_fetched(idp):
    docs, calls = idp
    docs[DISCOVERY] = {"issuer": ISSUER, "jwks_uri": ISSUER + "/protocol/openid-connect/certs"}
    docs[ISSUER + "/protocol/openid-connect/certs"] = public_jwks(make_private_jwks(1))
    assert {k["kid"] for k in fetch_jwks(issuer=ISSUER)["keys"]} == {"rs-1", "es-1"}
    assert calls == [DISCOVERY, ISSUER + "/protocol/openid-connect/certs"]


def test_cli_refuses_a_duplicate_kid_and_writes_nothing(idp, tmp_path, capsys):
    docs, _calls = idp
    old, new = _rsa(1), _rsa(2)
    new["kid"] = old["kid"]
    docs["http://127.0.0.1:8080/certs"] = {"keys": [old, new]}
    out = tmp_path / "jwks.json"
    rc = cli.main(["jwks", "--jwks-uri", "http://127.0.0.1:8080/certs", "--slurm", "--out", str(out)])
    assert rc != 0 and not out.exists()
    assert "several RSA signing keys with kid 'rs-1'" in capsys.readouterr().err
