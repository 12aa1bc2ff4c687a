"""Hypothesis fuzzing of the validator input: it never crashes and never accepts."""
from __future__ import annotations

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import TokenRejected
from support.oidc_forge import AUD, ISSUER, claims_for, make_private_jwks, public_jwks, sign

B64 = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", max_size=200)
JSONVAL = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12)
SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))


def _b64(obj) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def fz(tmp_path_factory):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import parse_config
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import JWKSCache
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import TokenValidator

    priv = make_private_jwks(1)
    cfg = parse_config({"issuer": ISSUER, "audience": AUD, "username_claim": "preferred_username",
                        "groups_claim": "groups", "allowed_groups": ["hpc-users"], "http_timeout": 1,
                        "min_refresh_interval": 3600,
                        "jwks_cache_dir": str(tmp_path_factory.mktemp("fuzzcache"))})
    cache = JWKSCache.from_config(cfg)
    cache.seed(public_jwks(priv))
    v = TokenValidator(cfg, cache)
    good = sign(priv, claims_for(ISSUER, AUD))
    assert v.validate(good)  # the fuzzing starts from a token that is accepted
    return v, good


def _check(v, token):
    try:
        v.validate(token)
    except TokenRejected as e:
        assert not e.reason.startswith("internal error"), e.reason
        return
    raise AssertionError(f"accepted a fuzzed token: {token!r}"[:300])


@SETTINGS
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300), st.integers(), st.none()))
def test_arbitrary_input(fz, value):
    _check(fz[0], value)


@SETTINGS
@given(header=JSONVAL, payload=JSONVAL, sig=B64)
def test_structured_garbage(fz, header, payload, sig):
    _check(fz[0], f"{_b64(header)}.{_b64(payload)}.{sig}")


@SETTINGS
@given(header=st.dictionaries(st.sampled_from(["alg", "kid", "typ", "crit", "enc", "b64", "jku", "x5u"]),
                              JSONVAL, max_size=5),
       claims=st.dictionaries(st.sampled_from(["iss", "aud", "exp", "iat", "nbf", "sub", "azp"]), JSONVAL,
                              max_size=7))
def test_real_signature_wrong_header_or_claims(fz, header, claims):
    v, good = fz
    h, p, s = good.split(".")
    _check(v, f"{_b64(header)}.{p}.{s}")  # header swapped under a real signature
    _check(v, f"{h}.{_b64(claims)}.{s}")  # payload swapped under a real signature


@SETTINGS
@given(pos=st.integers(min_value=0), ch=st.sampled_from("ABCxyz019-_.="))
def test_single_character_mutations(fz, pos, ch):
    v, good = fz
    i = pos % len(good)
    mutated = good[:i] + ch + good[i + 1:]
    if mutated == good:
        return
    try:
        v.validate(mutated)
    except TokenRejected as e:
        assert not e.reason.startswith("internal error"), e.reason
        return
    # base64url has spare bits in the last character of a segment; a change there can decode to the
    # same bytes. Acceptance is only legitimate when the decoded token is byte-identical.
    dec = [base64.urlsafe_b64decode(x + "=" * (-len(x) % 4)) for x in mutated.split(".")]
    orig = [base64.urlsafe_b64decode(x + "=" * (-len(x) % 4)) for x in good.split(".")]
    assert dec == orig, f"accepted a mutated token at {i}"
