# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``gpufleet-oidc``: debug and automation front end of the OIDC core (``oidc``; a body, it holds no rule).

* ``validate --config FILE [--user NAME]``: token on stdin; exit 0 and print the mapped local
  user only for a valid, authorised token, otherwise print the reason to stderr and exit
  non-zero (2 config, 3 invalid token, 4 not authorised, 5 IdP unavailable without cache).
* ``device --config FILE [--user NAME]``: run the device grant in the terminal (prints the URL
  and code), then validate as above; ``--print-token`` prints the token instead of the user.
* ``jwks (--config FILE | --issuer URL | --jwks-uri URL) [--slurm] [--out FILE]``: print (or
  atomically write) the IdP's public JWKS; ``--slurm`` normalises it for Slurm's auth/jwt (RSA
  keys only, ``alg`` set on each). Needs neither authlib nor joserfc (Slurm controllers).
* ``preflight --config FILE [--mode device|token] [--token-file FILE [--user NAME]]``: before a login node is
  switched to OIDC, from the node itself: the discovery document (with the device grant's endpoints in device
  mode) and a JWKS with a key for the allowed algorithms; with a test token, validate it through a scratch key
  cache (the node's own cache is not touched). Exit 0 only when all of it holds. Needs authlib and joserfc only
  for the test token.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from typing import List, Optional

from ..oidc.config import load_config
from ..oidc.core import Authenticator
from ..oidc.device import MAX_URI, MAX_USER_CODE, display_text
from ..oidc.errors import DeviceFlowError, IdPUnavailable, OIDCError
from ..oidc.jwks import usable_keys
from ..oidc.slurm import fetch_discovery, fetch_jwks, normalise_jwks_for_slurm, write_jwks


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufleet-oidc", description="OIDC token tools for gpufleet login nodes")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="validate a token read from stdin")
    v.add_argument("--config", required=True)
    v.add_argument("--user", help="also require the token to map to this local user")
    v.add_argument("--claims", action="store_true", help="print the verified claims as JSON after the user")
    d = sub.add_parser("device", help="log in with the device grant and validate the token")
    d.add_argument("--config", required=True)
    d.add_argument("--user")
    d.add_argument("--print-token", action="store_true")
    j = sub.add_parser("jwks", help="print or write the IdP's public JWKS")
    j.add_argument("--config")
    j.add_argument("--issuer", help="instead of --config: the issuer (discovery finds jwks_uri)")
    j.add_argument("--jwks-uri", help="instead of discovery")
    j.add_argument("--slurm", action="store_true", help="normalise for Slurm auth/jwt (RSA, alg on every key)")
    j.add_argument("--out", help="write atomically (mode 0400) when the content changed; prints changed/unchanged")
    f = sub.add_parser("preflight", help="before a login node is switched: reach the IdP from here, check its keys")
    f.add_argument("--config", required=True)
    f.add_argument("--mode", choices=["device", "token"], default="device")
    f.add_argument("--token-file", help="a test token to validate (through a scratch key cache)")
    f.add_argument("--user", help="with --token-file: the local user the token must map to")
    return p


def _preflight(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    meta = fetch_discovery(cfg.issuer, cfg.http_timeout)
    if args.mode == "device":
        missing = [k for k in ("device_authorization_endpoint", "token_endpoint") if not isinstance(meta.get(k), str)]
        if missing:
            raise IdPUnavailable(f"the discovery document has no {' or '.join(missing)}: no device login could start")
    jwks_uri = cfg.jwks_uri or meta["jwks_uri"]
    keys = usable_keys(fetch_jwks(jwks_uri=jwks_uri, timeout=cfg.http_timeout)["keys"], cfg.algorithms)
    if not keys:
        raise IdPUnavailable(f"the JWKS at {display_text(jwks_uri, MAX_URI)} has no key for the allowed algorithms "
                             f"({', '.join(cfg.algorithms)}): no token could be verified")
    kids = ", ".join(display_text(str(k.get("kid", "-")), 64) for k in keys[:8])
    _out(f"ok: discovery and JWKS of {display_text(cfg.issuer, MAX_URI)} reached from this host; "
         f"{len(keys)} key(s) for {', '.join(cfg.algorithms)} (kid {kids})")
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8", errors="replace") as fh:
                token = fh.read(cfg.max_token_bytes + 2).strip()
        except OSError as exc:
            _err(f"gpufleet-oidc: --token-file: cannot read {args.token_file}: {exc.strerror}")
            return 2
        lines: List[str] = []
        with tempfile.TemporaryDirectory(prefix="gpufleet-oidc-preflight-") as scratch:
            auth = Authenticator(dataclasses.replace(cfg, jwks_cache_dir=scratch), log=lines.append)
            try:
                user, _claims = auth.check_token(token, args.user)
            finally:
                for line in lines:
                    _err(f"gpufleet-oidc: {line}")
        _out(f"ok: the test token is valid and maps to {user}")
    return 0


def _jwks(args: argparse.Namespace) -> int:
    if args.config:
        cfg = load_config(args.config)
        jwks = fetch_jwks(cfg.issuer, args.jwks_uri or cfg.jwks_uri, cfg.http_timeout)
    else:
        jwks = fetch_jwks(args.issuer, args.jwks_uri)
    if args.slurm:
        jwks = normalise_jwks_for_slurm(jwks)
        if not jwks["keys"]:
            _err("gpufleet-oidc: rejected: the IdP publishes no RSA signing key Slurm could use")
            return 5
    if args.out:
        _out("changed" if write_jwks(args.out, jwks) else "unchanged")
    else:
        _out(json.dumps(jwks, indent=2, sort_keys=True))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "jwks":
            return _jwks(args)
        if args.cmd == "preflight":
            return _preflight(args)
        cfg = load_config(args.config)
        log_lines: List[str] = []

        def log(msg: str) -> None:
            log_lines.append(msg)

        auth = Authenticator(cfg, log=log)
        if args.cmd == "validate":
            token = sys.stdin.read(cfg.max_token_bytes + 2)
            try:
                user, claims = auth.check_token(token, args.user)
            finally:
                for line in log_lines:
                    _err(f"gpufleet-oidc: {line}")
            _out(user)
            if args.claims:
                _out(json.dumps(claims, sort_keys=True))
            return 0
        if args.cmd == "device":
            dg = auth.device_grant()
            grant = dg.start()
            url = display_text(grant.get("verification_uri_complete") or grant["verification_uri"], MAX_URI)
            _err(f"Open {url} and confirm the code {display_text(grant['user_code'], MAX_USER_CODE)}")
            resp = dg.poll(grant, cfg.device_timeout, first_delay=grant["interval"])
            token = auth.token_from_response(resp)
            if not isinstance(token, str) or not token:
                raise DeviceFlowError(f"token response has no {cfg.validate_token}")
            if args.print_token:
                _out(token)
                return 0
            user, _claims = auth.check_token(token, args.user)
            _out(user)
            return 0
    except OIDCError as e:
        _err(f"gpufleet-oidc: rejected: {e.reason}")
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
