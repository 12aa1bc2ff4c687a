"""An ID token is never accepted as an access token (or the reverse) when it carries the marks of its kind:
Keycloak's typ claim (ID / Bearer), at_hash / c_hash (ID tokens only), RFC 9068 at+jwt, id_token+jwt."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import TokenRejected
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import TokenValidator
from support.oidc_forge import AUD, ISSUER, claims_for, sign


@pytest.mark.parametrize("header, extra, reason", [
    ({"typ": "JWT"}, {"typ": "ID"}, "an ID token (claim typ 'ID')"),  # Keycloak ID token
    ({"typ": "JWT"}, {"at_hash": "x"}, "an ID token (claim at_hash)"),
    ({"typ": "JWT"}, {"c_hash": "x"}, "an ID token (claim c_hash)"),
    ({"typ": "application/id_token+jwt"}, {}, "an ID token (typ 'application/id_token+jwt')"),
])
def test_id_token_marks_refused_as_access_token(seeded, private_jwks, header, extra, reason):
    cfg, cache = seeded()
    tok = sign(private_jwks, claims_for(ISSUER, AUD, **extra), header=header)
    with pytest.raises(TokenRejected, match="is not accepted as access_token") as ei:
        TokenValidator(cfg, cache).validate(tok)
    assert ei.value.reason.startswith(reason)


@pytest.mark.parametrize("header, extra", [({"typ": "JWT"}, {"typ": "Bearer"}), ({"typ": "at+jwt"}, {})])
def test_access_token_marks_refused_as_id_token(seeded, private_jwks, header, extra):
    cfg, cache = seeded(validate_token="id_token")
    tok = sign(private_jwks, claims_for(ISSUER, AUD, **extra), header=header)
    with pytest.raises(TokenRejected, match="an access token .* is not accepted as id_token"):
        TokenValidator(cfg, cache).validate(tok)


@pytest.mark.parametrize("validate_token, header, extra", [
    ("access_token", {"typ": "JWT"}, {"typ": "Bearer"}),  # Keycloak access token
    ("access_token", {"typ": "at+jwt"}, {}),
    ("access_token", {"typ": "JWT"}, {}),  # Entra / Okta: no marks either way
    ("id_token", {"typ": "JWT"}, {"typ": "ID", "at_hash": "x"}),
    ("id_token", {"typ": "JWT"}, {}),
])
def test_matching_kinds_accepted(seeded, private_jwks, validate_token, header, extra):
    cfg, cache = seeded(validate_token=validate_token)
    tok = sign(private_jwks, claims_for(ISSUER, AUD, **extra), header=header)
    assert TokenValidator(cfg, cache).validate(tok)["sub"] == "sub-alice"
