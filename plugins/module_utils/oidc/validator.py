# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Local JWT validation with joserfc against the cached JWKS.

Order of checks (each failure raises :class:`TokenRejected` with a short reason):
size limit -> shape (JWE and opaque tokens refused) -> header (alg on the asymmetric allow-list,
no ``crit``, optional ``typ``) -> key by kid (rate-limited refresh) -> signature -> claims
(``iss``/``aud``/``exp``/``iat``/``sub`` required, ``nbf``, leeway) -> optional ``azp``,
max token age and ``acr``.
"""
from __future__ import annotations

import base64
import binascii
import time
from typing import Any, Callable, Dict, Optional

from .config import ASYMMETRIC_ALGORITHMS, OIDCConfig
from .errors import OIDCError, TokenRejected
from .jwks import JWKSCache
from .transport import json_loads

try:
    from joserfc import jwt as _jwt
    from joserfc.errors import (
        BadSignatureError,
        ExpiredTokenError,
        InvalidClaimError,
        JoseError,
        MissingClaimError,
    )
    from joserfc.jwk import import_key as _import_key

    HAS_JOSERFC = True
    JOSERFC_IMPORT_ERROR = None
except ImportError as _e:  # pragma: no cover - exercised by ansible-test import sanity
    HAS_JOSERFC = False
    JOSERFC_IMPORT_ERROR = _e


def _b64json(part: str, what: str) -> Any:
    try:
        pad = "=" * (-len(part) % 4)
        raw = base64.urlsafe_b64decode((part + pad).encode("ascii"))
        return json_loads(raw)
    except (binascii.Error, ValueError, UnicodeError):
        raise TokenRejected(f"malformed token: {what} is not base64url JSON")


def unverified_header(token: str) -> Dict[str, Any]:
    """Only to route the token (alg, kid); never trusted for anything else."""
    hdr = _b64json(token.split(".", 1)[0], "header")
    if not isinstance(hdr, dict):
        raise TokenRejected("malformed token: header is not a JSON object")
    return hdr


#: Marks of an ID token (OIDC Core: ``at_hash``/``c_hash`` exist only in ID tokens; Keycloak's ``typ`` claim says
#: ``ID``; some IdPs type ID tokens ``id_token+jwt``) and of an access token (RFC 9068 ``at+jwt``; Keycloak
#: ``Bearer``). A token carrying the marks of the other kind is refused whatever ``required_typ`` says.
ID_TOKEN_MARKS = {"header_typ": {"id_token+jwt"}, "claims": ("at_hash", "c_hash"), "claim_typ": {"id"}}
ACCESS_TOKEN_MARKS = {"header_typ": {"at+jwt"}, "claims": (), "claim_typ": {"bearer"}}


def token_kind_mismatch(header: Dict[str, Any], claims: Dict[str, Any], expected: str) -> Optional[str]:
    """Why a token is the wrong kind for ``expected`` (``access_token`` or ``id_token``), or None."""
    if expected == "access_token":
        marks, other = ID_TOKEN_MARKS, "an ID token"
    else:
        marks, other = ACCESS_TOKEN_MARKS, "an access token"
    if _norm_typ(header.get("typ", "")) in marks["header_typ"]:
        return f"{other} (typ {str(header.get('typ'))[:30]!r}) is not accepted as {expected}"
    for c in marks["claims"]:
        if c in claims:
            return f"{other} (claim {c}) is not accepted as {expected}"
    if isinstance(claims.get("typ"), str) and claims["typ"].lower() in marks["claim_typ"]:
        return f"{other} (claim typ {claims['typ'][:30]!r}) is not accepted as {expected}"
    return None


def _norm_typ(t: Any) -> str:
    t = str(t).lower()
    return t[len("application/"):] if t.startswith("application/") else t


class TokenValidator:
    def __init__(self, cfg: OIDCConfig, keys: Optional[JWKSCache] = None, clock: Callable[[], float] = time.time,
                 log: Optional[Callable[[str], None]] = None):
        if not HAS_JOSERFC:
            raise TokenRejected(f"joserfc is required for token validation: {JOSERFC_IMPORT_ERROR}")
        bad = [a for a in cfg.algorithms if a not in ASYMMETRIC_ALGORITHMS]
        if bad:  # config.parse_config refuses these already; this guards programmatic use
            raise ValueError(f"non-asymmetric algorithms refused: {bad}")
        self.cfg = cfg
        self.keys = keys or JWKSCache.from_config(cfg, log=log)
        self.clock = clock

    def validate(self, token: Any) -> Dict[str, Any]:
        """Return the verified claims or raise :class:`TokenRejected` / :class:`IdPUnavailable`.

        Anything unexpected fails closed as ``TokenRejected("internal error: ...")``.
        """
        try:
            return self._validate(token)
        except OIDCError:
            raise
        except Exception as e:  # fail closed on anything a hostile token might provoke
            raise TokenRejected(f"internal error: {type(e).__name__}")

    def _validate(self, token: Any) -> Dict[str, Any]:
        cfg = self.cfg
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise TokenRejected("malformed token: not ASCII")
        if not isinstance(token, str):
            raise TokenRejected("no token")
        token = token.strip()
        if not token:
            raise TokenRejected("empty token")
        if len(token) > cfg.max_token_bytes:
            raise TokenRejected(f"token too large ({len(token)} > {cfg.max_token_bytes} bytes)")
        if not token.isascii() or any(c.isspace() for c in token):
            raise TokenRejected("malformed token: unexpected characters")
        parts = token.split(".")
        if len(parts) == 5:
            raise TokenRejected("encrypted tokens (JWE) are not accepted")
        if len(parts) != 3 or not all(parts[:2]):
            raise TokenRejected("opaque or malformed token (not a JWS compact serialization)")
        header = unverified_header(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in cfg.algorithms:
            raise TokenRejected(f"algorithm not allowed: {str(alg)[:20]!r}")
        if "enc" in header:
            raise TokenRejected("encrypted tokens (JWE) are not accepted")
        if "crit" in header:
            raise TokenRejected("unsupported 'crit' header")
        if header.get("b64") is False:
            raise TokenRejected("unencoded payloads are not accepted")
        if cfg.required_typ and _norm_typ(header.get("typ", "")) not in {_norm_typ(t) for t in cfg.required_typ}:
            raise TokenRejected(f"token type {str(header.get('typ'))[:30]!r} not accepted")
        kid = header.get("kid")
        if kid is not None and (not isinstance(kid, str) or len(kid) > 256):
            raise TokenRejected("malformed token: bad kid")

        jwk = self.keys.find_key(kid, alg)
        try:
            key = _import_key(jwk)
        except (JoseError, ValueError, TypeError) as e:
            raise TokenRejected(f"signing key {kid!r} unusable: {type(e).__name__}")
        try:
            tok = _jwt.decode(token, key, algorithms=[alg])
        except BadSignatureError:
            raise TokenRejected("bad signature")
        except JoseError as e:
            raise TokenRejected(f"token rejected by JOSE layer: {getattr(e, 'error', type(e).__name__)}")
        except RecursionError:
            raise TokenRejected("malformed token: JSON nested too deeply")
        except (ValueError, TypeError) as e:
            raise TokenRejected(f"malformed token: {type(e).__name__}")
        claims = tok.claims

        now = int(self.clock())
        opts: Dict[str, Any] = {
            "iss": {"essential": True, "value": cfg.issuer},
            "aud": {"essential": True, "values": list(cfg.audiences)},
            "exp": {"essential": True},
            "iat": {"essential": True},
            "sub": {"essential": True},
        }
        try:
            _jwt.JWTClaimsRegistry(now=now, leeway=cfg.leeway, **opts).validate(claims)
        except ExpiredTokenError:
            raise TokenRejected("token expired")
        except MissingClaimError as e:
            raise TokenRejected(f"missing required claim: {e.claim}")
        except InvalidClaimError as e:
            desc = str(getattr(e, "description", ""))
            if e.claim == "nbf":
                raise TokenRejected("token not yet valid (nbf in the future)")
            if e.claim == "iat" and "future" in desc:
                raise TokenRejected("token issued in the future (iat)")
            raise TokenRejected(f"invalid claim: {e.claim}")
        except JoseError as e:
            raise TokenRejected(f"claims rejected: {getattr(e, 'error', type(e).__name__)}")
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise TokenRejected("missing required claim: sub")
        wrong = token_kind_mismatch(header, claims, cfg.validate_token)
        if wrong:
            raise TokenRejected(wrong)

        exp, iat = claims["exp"], claims["iat"]
        if exp - now > cfg.max_token_lifetime + cfg.leeway or exp - iat > cfg.max_token_lifetime + cfg.leeway:
            raise TokenRejected(f"token lifetime longer than max_token_lifetime ({cfg.max_token_lifetime} s)")
        aud = claims.get("aud")
        if cfg.validate_token == "id_token" and isinstance(aud, list):
            # OIDC Core 3.1.3.7 (3): an ID token with audiences the client does not trust is rejected, unless the
            # authorised party is one of ours (then the extra audiences are the IdP's business)
            extra = [a for a in aud if a not in cfg.audiences]
            if extra and claims.get("azp") not in cfg.audiences:
                raise TokenRejected(f"ID token for other audiences too ({str(extra[0])[:60]!r}) and azp is not ours")
        if cfg.allowed_azp:
            azp = claims.get("azp", claims.get("client_id"))
            aud = claims.get("aud")
            if azp is None and isinstance(aud, list) and len(aud) == 1:
                aud = aud[0]
            if azp is None and isinstance(aud, str):
                azp = aud  # OIDC Core 3.1.3.7: without azp the single audience is the authorised party
            if azp not in cfg.allowed_azp:
                raise TokenRejected(f"authorised party {str(azp)[:60]!r} not allowed")
        if cfg.max_token_age is not None and now - claims["iat"] > cfg.max_token_age + cfg.leeway:
            raise TokenRejected(f"token older than max_token_age ({int(now - claims['iat'])} s)")
        if cfg.acr_values and claims.get("acr") not in cfg.acr_values:
            raise TokenRejected(f"acr {str(claims.get('acr'))[:40]!r} not accepted")
        return claims
