"""Validator catalogue: valid tokens accepted, every hostile token rejected with its reason."""
from __future__ import annotations

import time

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import TokenRejected
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import TokenValidator
from support.oidc_forge import (
    AUD,
    ISSUER,
    claims_for,
    encrypted,
    hs256_with_public_pem,
    make_private_jwks,
    padded_to,
    sign,
    tamper_payload,
    unsigned,
    with_header,
)


@pytest.fixture
def validator(seeded):
    cfg, cache = seeded()
    return TokenValidator(cfg, cache)


def test_valid_rs256_and_es256(validator, private_jwks):
    c = claims_for(ISSUER, AUD)
    assert validator.validate(sign(private_jwks, c, "rs-1"))["sub"] == "sub-alice"
    assert validator.validate(sign(private_jwks, c, "es-1"))["preferred_username"] == "alice"


def test_expiry_within_leeway_is_accepted(validator, private_jwks):
    now = int(time.time())
    c = claims_for(ISSUER, AUD, exp=now - 20, iat=now - 600)
    assert validator.validate(sign(private_jwks, c))["exp"] == now - 20


def test_audience_list_matches_any(validator, private_jwks):
    c = claims_for(ISSUER, ["other", AUD])
    assert validator.validate(sign(private_jwks, c))


def _bad(private, **kw):
    return sign(private, claims_for(ISSUER, AUD, **kw))


HOSTILE = {
    "expired": (lambda p: _bad(p, exp=int(time.time()) - 3600, iat=int(time.time()) - 7200), "token expired"),
    "nbf_future": (lambda p: _bad(p, nbf=int(time.time()) + 3600), "not yet valid"),
    "iat_future": (lambda p: _bad(p, iat=int(time.time()) + 3600), "issued in the future"),
    "wrong_iss": (lambda p: sign(p, claims_for("http://127.0.0.1:10", AUD)), "invalid claim: iss"),
    "wrong_aud": (lambda p: sign(p, claims_for(ISSUER, "urn:other")), "invalid claim: aud"),
    "missing_sub": (lambda p: sign(p, {k: v for k, v in claims_for(ISSUER, AUD).items() if k != "sub"}),
                    "missing required claim: sub"),
    "missing_exp": (lambda p: sign(p, {k: v for k, v in claims_for(ISSUER, AUD).items() if k != "exp"}),
                    "missing required claim: exp"),
    "missing_iat": (lambda p: sign(p, {k: v for k, v in claims_for(ISSUER, AUD).items() if k != "iat"}),
                    "missing required claim: iat"),
    "empty_sub": (lambda p: _bad(p, sub=""), "sub"),
    "alg_none": (lambda p: unsigned(claims_for(ISSUER, AUD)), "algorithm not allowed: 'none'"),
    "alg_none_no_kid": (lambda p: unsigned(claims_for(ISSUER, AUD), kid=None), "algorithm not allowed"),
    "hs256_public_pem": (lambda p: hs256_with_public_pem(p, claims_for(ISSUER, AUD)), "algorithm not allowed: 'HS256'"),
    "tampered_payload": (lambda p: tamper_payload(sign(p, claims_for(ISSUER, AUD)), preferred_username="bob"),
                         "bad signature"),
    "other_key_same_kid": (lambda p: sign(make_private_jwks(9) | {}, claims_for(ISSUER, AUD), "rs-9",
                                          header={"kid": "rs-1"}), "bad signature"),
    "unknown_kid": (lambda p: sign(make_private_jwks(7), claims_for(ISSUER, AUD), "rs-7"), "unknown signing key"),
    "es256_header_rsa_kid": (lambda p: sign(make_private_jwks(8), claims_for(ISSUER, AUD), "es-8",
                                            header={"kid": "rs-1"}), "unknown signing key"),
    "jwe": (lambda p: encrypted(p, claims_for(ISSUER, AUD)), "encrypted tokens (JWE)"),
    "opaque": (lambda p: "2YotnFZFEjr1zCsicMWpAA", "opaque or malformed"),
    "oversize": (lambda p: padded_to(p, claims_for(ISSUER, AUD), 17000), "token too large"),
    "garbage_header": (lambda p: "e30x.eyJ9.c2ln", "malformed token"),
    "empty": (lambda p: "   ", "empty token"),
    "crit_header": (lambda p: with_header(sign(p, claims_for(ISSUER, AUD)), crit=["x"], x=1), "crit"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_token_rejected_with_reason(validator, private_jwks, case):
    make, reason = HOSTILE[case]
    token = make(private_jwks)
    with pytest.raises(TokenRejected) as ei:
        validator.validate(token)
    assert reason in ei.value.reason, ei.value.reason
    assert "internal error" not in ei.value.reason


def test_unknown_kid_refresh_is_rate_limited(seeded, private_jwks):
    cfg, cache = seeded(min_refresh_interval=300)
    v = TokenValidator(cfg, cache)
    forged = make_private_jwks(5)
    for i in range(5):
        with pytest.raises(TokenRejected, match="unknown signing key"):
            v.validate(sign(forged, claims_for(ISSUER, AUD, jti=str(i)), "rs-5"))
    # The cache was seeded just now, so no refresh may have been attempted at all.
    assert cache.fetches == 0


def test_unknown_kid_one_refresh_after_interval(seeded, private_jwks):
    cfg, cache = seeded(min_refresh_interval=0)
    v = TokenValidator(cfg, cache)
    forged = make_private_jwks(6)
    with pytest.raises(TokenRejected, match="unknown signing key"):
        v.validate(sign(forged, claims_for(ISSUER, AUD), "rs-6"))
    assert cache.fetches == 1  # one (failing) discovery attempt, then rejected; valid tokens still pass
    assert v.validate(sign(private_jwks, claims_for(ISSUER, AUD)))


def test_required_typ_azp_max_age_acr(seeded, private_jwks):
    cfg, cache = seeded(required_typ=["at+jwt"], allowed_azp=["gpufleet-device"], max_token_age=120,
                        acr_values=["mfa"])
    v = TokenValidator(cfg, cache)
    good = claims_for(ISSUER, AUD, azp="gpufleet-device", acr="mfa")
    assert v.validate(sign(private_jwks, good))
    with pytest.raises(TokenRejected, match="token type"):
        v.validate(sign(private_jwks, good, header={"typ": "JWT"}))
    with pytest.raises(TokenRejected, match="authorised party"):
        v.validate(sign(private_jwks, dict(good, azp="evil")))
    with pytest.raises(TokenRejected, match="max_token_age"):
        now = int(time.time())
        v.validate(sign(private_jwks, dict(good, iat=now - 1000, exp=now + 600)))
    with pytest.raises(TokenRejected, match="acr"):
        v.validate(sign(private_jwks, dict(good, acr="pwd")))


def test_algorithm_not_in_allow_list(seeded, private_jwks):
    cfg, cache = seeded(algorithms=["ES256"])
    v = TokenValidator(cfg, cache)
    with pytest.raises(TokenRejected, match="algorithm not allowed: 'RS256'"):
        v.validate(sign(private_jwks, claims_for(ISSUER, AUD), "rs-1"))
    assert v.validate(sign(private_jwks, claims_for(ISSUER, AUD), "es-1"))


def test_a_token_for_ever_is_refused_and_the_limit_is_the_sites(seeded, private_jwks):
    """exp 1e308 was accepted: the lifetime (from now and from iat) is capped at max_token_lifetime (24 h)."""
    cfg, cache = seeded()
    v = TokenValidator(cfg, cache)
    now = int(time.time())
    assert cfg.max_token_lifetime == 86400
    assert v.validate(sign(private_jwks, claims_for(ISSUER, AUD, iat=now, exp=now + 86400)))  # the control
    for exp, iat in ((1e308, now), (now + 86400 + 61 + 5, now), (now + 3600, now - 90000)):
        with pytest.raises(TokenRejected, match=r"token lifetime longer than max_token_lifetime \(86400 s\)"):
            v.validate(sign(private_jwks, claims_for(ISSUER, AUD, iat=iat, exp=exp)))
    cfg, cache = seeded(max_token_lifetime=600)
    with pytest.raises(TokenRejected, match="max_token_lifetime"):
        TokenValidator(cfg, cache).validate(sign(private_jwks, claims_for(ISSUER, AUD, iat=now, exp=now + 3600)))


def test_an_id_token_for_untrusted_audiences_too_is_refused_unless_azp_is_ours(seeded, private_jwks):
    """OIDC Core 3.1.3.7 (3): extra audiences the client does not trust reject an ID token, unless azp is ours.
    Access tokens keep the list match (IdPs add their own APIs to an access token's aud)."""
    cfg, cache = seeded(validate_token="id_token")
    v = TokenValidator(cfg, cache)

    def id_token(claims):
        return sign(private_jwks, claims, header={"typ": "JWT"})

    assert v.validate(id_token(claims_for(ISSUER, [AUD])))  # the control: only ours
    with pytest.raises(TokenRejected, match=r"ID token for other audiences too \('urn:evil'\) and azp is not ours"):
        v.validate(id_token(claims_for(ISSUER, [AUD, "urn:evil"])))
    with pytest.raises(TokenRejected, match="azp is not ours"):
        v.validate(id_token(claims_for(ISSUER, [AUD, "urn:evil"], azp="urn:evil")))
    assert v.validate(id_token(claims_for(ISSUER, [AUD, "urn:api"], azp=AUD)))
    cfg, cache = seeded()  # access tokens
    assert TokenValidator(cfg, cache).validate(sign(private_jwks, claims_for(ISSUER, [AUD, "urn:api"])))
