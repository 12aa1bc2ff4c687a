"""Fixtures for the OIDC core unit tests: real keys, a real on-disk JWKS cache, no network.

The issuer points at 127.0.0.1:9 (nothing listens there), so every refresh attempt is a real,
failing network call: tests see exactly what a login node sees when the IdP is down.
"""
from __future__ import annotations

import pytest

from support.oidc_forge import AUD, ISSUER, make_private_jwks, public_jwks

# The collection is imported inside the fixtures, not here: pytest-ansible installs Ansible's
# collection finder after conftest files load, and a half-imported package confuses it.


@pytest.fixture(scope="session")
def private_jwks():
    return make_private_jwks(1)


@pytest.fixture
def base_conf(tmp_path):
    return {
        "issuer": ISSUER,
        "audience": AUD,
        "username_claim": "preferred_username",
        "groups_claim": "groups",
        "allowed_groups": ["hpc-users"],
        "jwks_cache_dir": str(tmp_path / "cache"),
        "http_timeout": 1,
    }


@pytest.fixture
def make_cfg(base_conf):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import parse_config

    def make(**over):
        d = dict(base_conf)
        d.update(over)
        return parse_config(d)

    return make


@pytest.fixture
def seeded(make_cfg, private_jwks):
    """(cfg, cache) with the public keys installed as a fresh cache entry."""
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import JWKSCache

    def make(**over):
        cfg = make_cfg(**over)
        cache = JWKSCache.from_config(cfg)
        cache.seed(public_jwks(private_jwks))
        return cfg, cache

    return make
