"""Test keys and a token forger for the OIDC tests (unit and integration).

Keys are real joserfc keys; the test IdP signs with the same private JWKS, so tokens forged here
are indistinguishable from the IdP's except where a test makes them hostile on purpose.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.server
import json
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional

from joserfc import jwe, jwt
from joserfc.jwk import ECKey, KeySet, RSAKey
from joserfc.jws import JWSRegistry

#: the unit tests' issuer: nothing listens on 127.0.0.1:9, so every refresh is a real, failing call
ISSUER = "http://127.0.0.1:9"
AUD = "urn:gpufleet:ssh"


@contextlib.contextmanager
def serve_json(document: Any, path: str = "/jwks") -> Iterator[str]:
    """A real HTTP server on loopback that answers GET ``path`` with ``document`` as JSON (404 elsewhere), as an
    IdP's keys endpoint does; yields its URL and is stopped when the block ends."""
    with serve_routes(lambda _base: {path: document}) as base:
        yield base + path


@contextlib.contextmanager
def serve_routes(routes: Callable[[str], Dict[str, Any]]) -> Iterator[str]:
    """A real HTTP server on loopback answering GET of each path of ``routes(base_url)`` with its JSON document
    (404 elsewhere): an IdP whose discovery document names its own URL. Yields the base URL; stopped at the end."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    bodies = {p: json.dumps(doc).encode() for p, doc in routes(base).items()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = bodies.get(self.path)
            self.send_response(404 if body is None else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            if body is not None:
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield base
    finally:
        server.shutdown()
        server.server_close()


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def make_private_jwks(generation: int = 1) -> Dict[str, Any]:
    rsa = RSAKey.generate_key(2048, parameters={"kid": f"rs-{generation}", "alg": "RS256", "use": "sig"})
    ec = ECKey.generate_key("P-256", parameters={"kid": f"es-{generation}", "alg": "ES256", "use": "sig"})
    return {"keys": [rsa.as_dict(private=True), ec.as_dict(private=True)]}


def public_jwks(private: Dict[str, Any]) -> Dict[str, Any]:
    ks = KeySet.import_key_set(private)
    return ks.as_dict(private=False)


def key_by_kid(private: Dict[str, Any], kid: str):
    for k in private["keys"]:
        if k["kid"] == kid:
            return (RSAKey if k["kty"] == "RSA" else ECKey).import_key(k)
    raise KeyError(kid)


_REG = JWSRegistry(algorithms=["RS256", "ES256", "PS256", "RS384", "ES384"])


def claims_for(issuer: str, audience: Any, user: str = "alice", groups=("hpc-users",), **extra: Any) -> Dict[str, Any]:
    now = int(time.time())
    c = {"iss": issuer, "aud": audience, "sub": f"sub-{user}", "iat": now, "exp": now + 600,
         "preferred_username": user, "groups": list(groups)}
    c.update(extra)
    return {k: v for k, v in c.items() if v is not None}


def sign(private: Dict[str, Any], claims: Dict[str, Any], kid: str = "rs-1", alg: Optional[str] = None,
         header: Optional[Dict[str, Any]] = None) -> str:
    key = key_by_kid(private, kid)
    alg = alg or ("RS256" if key.key_type == "RSA" else "ES256")
    hdr = {"alg": alg, "kid": kid, "typ": "at+jwt"}
    hdr.update(header or {})
    return jwt.encode(hdr, claims, key, algorithms=[alg], registry=_REG)


def unsigned(claims: Dict[str, Any], kid: Optional[str] = "rs-1") -> str:
    hdr = {"alg": "none"}
    if kid:
        hdr["kid"] = kid
    return f"{b64u(json.dumps(hdr).encode())}.{b64u(json.dumps(claims).encode())}."


def hs256_with_public_pem(private: Dict[str, Any], claims: Dict[str, Any], kid: str = "rs-1") -> str:
    """Key confusion: HMAC keyed with the RSA public key PEM, as a naive verifier would compute it."""
    pem = key_by_kid(private, kid).as_pem(private=False)
    signing = f"{b64u(json.dumps({'alg': 'HS256', 'kid': kid}).encode())}.{b64u(json.dumps(claims).encode())}"
    mac = hmac.new(pem, signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{b64u(mac)}"


def tamper_payload(token: str, **changes: Any) -> str:
    h, p, s = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))
    claims.update(changes)
    return f"{h}.{b64u(json.dumps(claims).encode())}.{s}"


def encrypted(private: Dict[str, Any], claims: Dict[str, Any], kid: str = "rs-1") -> str:
    jwk = dict(next(k for k in private["keys"] if k["kid"] == kid), use="enc")
    key = RSAKey.import_key({n: v for n, v in jwk.items() if n in ("kty", "n", "e", "kid", "use")})
    return jwt.encode({"alg": "RSA-OAEP-256", "enc": "A256GCM", "kid": kid}, claims, key,
                      registry=jwe.JWERegistry(algorithms=["RSA-OAEP-256", "A256GCM"]))


def padded_to(private: Dict[str, Any], claims: Dict[str, Any], length: int, kid: str = "rs-1") -> str:
    """A validly signed token of about ``length`` characters (padding claim)."""
    c = dict(claims)
    c["pad"] = ""
    base = len(sign(private, c, kid))
    c["pad"] = "x" * max(0, int((length - base) * 3 / 4))
    return sign(private, c, kid)


def with_header(token: str, **changes: Any) -> str:
    """Replace header fields of a signed token (the signature no longer matches)."""
    h, p, s = token.split(".")
    hdr = json.loads(base64.urlsafe_b64decode(h + "=" * (-len(h) % 4)))
    hdr.update(changes)
    return f"{b64u(json.dumps(hdr).encode())}.{p}.{s}"
