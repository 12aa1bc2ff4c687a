# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""JWKS for Slurm's auth/jwt plugin.

Slurm 22.05 skips JWKS keys without ``"alg": "RS256"`` (Entra publishes none), uses only RSA
keys, and older releases choke on ``x5c``; 26.05 stops fatal()ing on non-RSA keys. So: keep
RSA signature keys with a kid, set ``alg`` to RS256, keep only kty/kid/use/alg/n/e.
Slurm checks only the signature and ``exp`` (no iss/aud, no leeway), so the file must hold
keys of a dedicated IdP realm/tenant only. Slurm verifies a token with the first key whose kid
matches and never tries another, so two RSA keys with one kid are refused here (a rotation that
reused a kid would make Slurm refuse every token of the other key).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from . import transport as http
from .errors import IdPUnavailable
from .jwks import atomic_write_json, check_endpoints, public_keys_only


def fetch_discovery(issuer: str, timeout: float = 10.0) -> Dict[str, Any]:
    """The issuer's discovery document, checked: https (plain http only to loopback), the issuer it names is the
    one asked for, and the endpoints used here stay on the issuer's origin (:func:`jwks.check_endpoints`)."""
    http.require_secure_url(issuer, "issuer")
    meta = http.get_json(issuer.rstrip("/") + "/.well-known/openid-configuration", timeout=timeout)
    if not isinstance(meta, dict) or meta.get("issuer") != issuer:
        raise IdPUnavailable(f"discovery issuer {meta.get('issuer') if isinstance(meta, dict) else None!r} "
                             f"!= {issuer!r}")
    jwks_uri = meta.get("jwks_uri")
    if not isinstance(jwks_uri, str):
        raise IdPUnavailable("discovery document has no jwks_uri")
    http.require_secure_url(jwks_uri, "jwks_uri")  # the plainer message first: plain http off loopback
    return check_endpoints(meta, issuer)


def fetch_jwks(issuer: Optional[str] = None, jwks_uri: Optional[str] = None, timeout: float = 10.0) -> Dict[str, Any]:
    """The IdP's public JWKS: from ``jwks_uri``, or found through the issuer's discovery document.

    Slurm trusts these keys for every user, so the issuer and the JWKS URL (given or discovered) must be https
    (plain http only to loopback), exactly as for the login cache (:func:`transport.require_secure_url`), and a
    discovered JWKS URL must stay on the issuer's origin (:func:`jwks.check_endpoints`, the login's rule).
    """
    if not jwks_uri:
        if not issuer:
            raise IdPUnavailable("either issuer or jwks_uri is needed")
        jwks_uri = fetch_discovery(issuer, timeout)["jwks_uri"]
    http.require_secure_url(jwks_uri, "jwks_uri")
    return {"keys": public_keys_only(http.get_json(jwks_uri, timeout=timeout))}


def normalise_jwks_for_slurm(jwks: Dict[str, Any]) -> Dict[str, Any]:
    keys = []
    for k in jwks.get("keys", []):
        if not isinstance(k, dict) or k.get("kty") != "RSA" or not isinstance(k.get("kid"), str) or not k["kid"]:
            continue
        if k.get("use", "sig") != "sig" or k.get("alg", "RS256") != "RS256":
            continue
        if not isinstance(k.get("n"), str) or not isinstance(k.get("e"), str):
            continue
        keys.append({"kty": "RSA", "kid": k["kid"], "use": "sig", "alg": "RS256", "n": k["n"], "e": k["e"]})
    kids = [k["kid"] for k in keys]
    twice = sorted({kid for kid in kids if kids.count(kid) > 1})
    if twice:
        raise IdPUnavailable(f"the JWKS has several RSA signing keys with kid {', '.join(ascii(k) for k in twice)}: "
                             "Slurm's auth/jwt verifies with the first key of a kid only and would refuse tokens "
                             "signed by the other")
    keys.sort(key=lambda x: x["kid"])
    return {"keys": keys}


def write_jwks(path: str, jwks: Dict[str, Any], mode: int = 0o400) -> bool:
    """Write atomically when the content differs. Returns True when the file changed."""
    try:
        with open(path, encoding="utf-8") as fh:
            if json.load(fh) == jwks and (os.stat(path).st_mode & 0o777) == mode:
                return False
    except (OSError, ValueError):
        pass
    atomic_write_json(path, jwks, mode=mode)
    return True
