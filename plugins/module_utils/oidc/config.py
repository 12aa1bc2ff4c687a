# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""YAML configuration: schema, presets (Keycloak, Okta, Entra ID) and validation.

Every error names the offending key. Unknown keys are errors too (a typo such as
``allowed_group`` must not silently disable the group gate).
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .. import spec
from ..safeyaml import MAX_FLOW_DEPTH, flow_depth
from .errors import ConfigError
from .transport import is_plain_ascii, is_secure_url

try:
    import yaml

    HAS_YAML = True
    YAML_IMPORT_ERROR = None
except ImportError as _e:  # pragma: no cover - exercised by ansible-test import sanity
    HAS_YAML = False
    YAML_IMPORT_ERROR = _e

#: Only asymmetric JWS algorithms can ever be allowed. ``none`` and HS* are refused at load time
#: (joserfc accepts ``none`` when it is explicitly allowed, and HS256 keyed with a public key is
#: the classic key-confusion attack).
ASYMMETRIC_ALGORITHMS = frozenset(
    ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA", "Ed25519"]
)

#: Presets fill in defaults for a family of IdPs. Explicit keys in the file always win.
PRESETS: Dict[str, Dict[str, Any]] = {
    # Keycloak: groups via a "Group Membership" mapper (full path off), realm roles via the
    # "realm roles" mapper; add an audience mapper so access tokens carry our API audience.
    "keycloak": {
        "username_claim": "preferred_username",
        "groups_claim": "groups",
        "algorithms": ["RS256", "ES256", "PS256"],
        "username_lowercase": True,
    },
    # Okta: only a *custom* authorization server mints access tokens other APIs can validate
    # (issuer https://ORG.okta.com/oauth2/<id>); preferred_username is the login (an email).
    "okta": {
        "username_claim": "preferred_username",
        "groups_claim": "groups",
        "algorithms": ["RS256"],
        "username_lowercase": True,
    },
    # Entra ID: v2 issuer https://login.microsoftonline.com/<tenant>/v2.0, audience api://<app>
    # (never validate Graph tokens), app roles arrive in "roles" (names, not GUIDs), groups in
    # "groups" are object-id GUIDs and overflow past 200; device code may be blocked by
    # Conditional Access. UPNs carry the tenant domain.
    "entra": {
        "username_claim": "preferred_username",
        "groups_claim": "roles",
        "algorithms": ["RS256"],
        "username_lowercase": True,
    },
}

#: Presets whose user names are ``user@domain`` (an email or UPN): the file must say which domains are the site's
#: (``allowed_domains``); a name in any other domain is refused, never stripped to its local part.
DOMAIN_PRESETS = ("okta", "entra")

_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold_ascii(name: str) -> str:
    """Lower-case A-Z only. ``str.lower()``, ``casefold()`` and NFKC map look-alikes (U+212A KELVIN SIGN, long s,
    ligatures, full-width letters) onto ASCII letters; an identity is never passed through them."""
    return name.translate(_ASCII_FOLD)


DEFAULT_USERNAME_REGEX = r"^[a-z_][a-z0-9_.-]{0,31}$"


@dataclass
class OIDCConfig:
    issuer: str
    audiences: List[str]
    username_claim: str
    groups_claim: str
    allowed_groups: List[str]
    jwks_cache_dir: str
    preset: Optional[str] = None
    groups_match: str = "any"
    denied_groups: List[str] = field(default_factory=list)
    denied_users: List[str] = field(default_factory=lambda: ["root"])
    algorithms: List[str] = field(default_factory=lambda: ["RS256", "ES256"])
    leeway: int = 60
    max_token_bytes: int = 16384
    required_typ: List[str] = field(default_factory=list)
    allowed_azp: List[str] = field(default_factory=list)
    max_token_age: Optional[int] = None
    max_token_lifetime: int = 86400  # exp at most this far ahead of now (and of iat): no token for ever
    acr_values: List[str] = field(default_factory=list)
    allowed_domains: List[str] = field(default_factory=list)
    min_uid: int = 1000
    max_uid: int = 60000
    username_lowercase: bool = True
    username_regex: str = DEFAULT_USERNAME_REGEX
    user_map: Dict[str, str] = field(default_factory=dict)
    require_local_user: bool = False
    jwks_uri: Optional[str] = None
    jwks_ttl: int = 3600
    metadata_ttl: int = 86400
    max_stale: int = 7 * 86400
    min_refresh_interval: int = 30
    http_timeout: float = 5.0
    client_id: Optional[str] = None
    client_secret: Optional[str] = None
    scope: str = "openid profile email"
    resource: Optional[str] = None
    device_timeout: int = 120
    validate_token: str = "access_token"
    log_file: Optional[str] = None
    proxy: Optional[str] = None


#: Settings whose value is a secret: shown as :data:`REDACTED` in module results and diffs (the file keeps them).
SECRET_KEYS = ("client_secret",)
#: What a secret is shown as (the marker Ansible itself uses for no_log values).
REDACTED = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def _proxy_password(v: Any) -> Optional[str]:
    """The password of ``http://user:password@host:port`` (``proxy`` may carry credentials), else None."""
    if not isinstance(v, str):
        return None
    try:
        return urllib.parse.urlsplit(v).password or None
    except ValueError:
        return None


def secret_values(data: Any) -> List[str]:
    """The secret strings in a configuration mapping: ``client_secret`` and a password in ``proxy``."""
    if not isinstance(data, dict):
        return []
    out = [str(data[k]) for k in SECRET_KEYS
           if data.get(k) is not None and not isinstance(data[k], bool) and str(data[k])]
    pw = _proxy_password(data.get("proxy"))
    if pw:
        out.append(pw)
    return out


def redact_config(data: Any) -> Any:
    """A copy of a configuration mapping with its secrets replaced by :data:`REDACTED`, for output only."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for k in SECRET_KEYS:
        if out.get(k) is not None:
            out[k] = REDACTED
    pw = _proxy_password(out.get("proxy"))
    if pw:
        out["proxy"] = out["proxy"].replace(f":{pw}@", f":{REDACTED}@", 1)
    return out


_REQUIRED = ("issuer", "audience", "username_claim", "groups_claim", "allowed_groups", "jwks_cache_dir")


#: Keys whose value never appears in an error message (it reaches stderr and the PAM log).
_UNSHOWN = SECRET_KEYS + ("proxy",)


def _str(key: str, v: Any, allow_empty: bool = False) -> str:
    return spec.string(v, key, empty_ok=allow_empty, shown=key not in _UNSHOWN, fail=ConfigError)


def _str_list(key: str, v: Any, allow_empty: bool = True, scalar_ok: bool = False) -> List[str]:
    return spec.string_list(v, key, empty_ok=allow_empty, scalar_ok=scalar_ok, fail=ConfigError)


def _int(key: str, v: Any, minimum: int = 0) -> int:
    return spec.integer(v, key, minimum, fail=ConfigError)


def _bool(key: str, v: Any) -> bool:
    return spec.boolean(v, key, fail=ConfigError)


def _url(key: str, v: Any) -> str:
    v = _str(key, v)
    if not re.match(r"^https?://[^\s/]+", v):
        raise ConfigError(key, f"expected an http(s) URL, got {v!r}")
    if not is_secure_url(v):
        raise ConfigError(key, "plain http is only allowed for loopback addresses; use https")
    return v


def _domains(data: Dict[str, Any], preset: Optional[str]) -> Dict[str, Any]:
    """``allowed_domains`` (``username_strip_domains`` is its old name): the domains whose ``user@domain`` names map
    to ``user``; names in any other domain are refused. ``*`` (any domain) is refused: ``alice@evil.example``
    would log in as ``alice``."""
    if "allowed_domains" in data and "username_strip_domains" in data:
        raise ConfigError("username_strip_domains", "old name of allowed_domains: set only allowed_domains")
    key = "username_strip_domains" if "username_strip_domains" in data else "allowed_domains"
    if key not in data:
        if preset in DOMAIN_PRESETS:
            raise ConfigError("allowed_domains", f"preset {preset} maps user@domain names: list the domains of "
                                                 "your users (names in other domains are refused), or [] when "
                                                 "names carry no domain")
        return {}
    doms = _str_list(key, data[key], scalar_ok=True)
    for d in doms:
        if d == "*" or not is_plain_ascii(d) or "@" in d:
            raise ConfigError(key, f"expected domain names such as corp.example ('*' is not accepted: it would "
                                   f"map alice@evil.example to alice), got {ascii(d)[:80]}")
    return {"allowed_domains": doms}


def parse_config(data: Any) -> OIDCConfig:
    """Validate a mapping (already parsed YAML) and return an :class:`OIDCConfig`."""
    if not isinstance(data, dict):
        raise ConfigError("", "the configuration must be a YAML mapping")
    data = dict(data)
    known = set(OIDCConfig.__dataclass_fields__) - {"audiences"} | {"audience", "username_strip_domains"}
    for k in data:
        if k not in known:
            raise ConfigError(str(k), "unknown setting")
    preset = data.get("preset")
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError("preset", f"expected one of {sorted(PRESETS)}, got {preset!r}")
        merged = dict(PRESETS[preset])
        merged.update(data)
        data = merged
    for k in _REQUIRED:
        if k not in data or data[k] is None:
            raise ConfigError(k, "required setting is missing")

    kw: Dict[str, Any] = {"preset": preset}
    kw["issuer"] = _url("issuer", data["issuer"])  # kept exactly: it must equal the token's iss
    kw["audiences"] = _str_list("audience", data["audience"], allow_empty=False, scalar_ok=True)
    kw["username_claim"] = _str("username_claim", data["username_claim"])
    kw["groups_claim"] = _str("groups_claim", data["groups_claim"])
    kw["allowed_groups"] = _str_list("allowed_groups", data["allowed_groups"], allow_empty=False)
    kw["jwks_cache_dir"] = _str("jwks_cache_dir", data["jwks_cache_dir"])
    if not kw["jwks_cache_dir"].startswith("/"):
        raise ConfigError("jwks_cache_dir", "expected an absolute path")

    if "groups_match" in data:
        if data["groups_match"] not in ("any", "all"):
            raise ConfigError("groups_match", f"expected 'any' or 'all', got {data['groups_match']!r}")
        kw["groups_match"] = data["groups_match"]
    for k in ("denied_groups", "required_typ", "allowed_azp", "acr_values"):
        if k in data:
            kw[k] = _str_list(k, data[k], scalar_ok=True)
    kw.update(_domains(data, preset))
    if "denied_users" in data:
        kw["denied_users"] = _str_list("denied_users", data["denied_users"])
    # root is always denied, whatever the file says.
    kw["denied_users"] = sorted(set(kw.get("denied_users", ["root"])) | {"root"})
    if "algorithms" in data:
        algs = _str_list("algorithms", data["algorithms"], allow_empty=False)
        bad = [a for a in algs if a not in ASYMMETRIC_ALGORITHMS]
        if bad:
            raise ConfigError(
                "algorithms", f"only asymmetric algorithms are allowed ({', '.join(sorted(ASYMMETRIC_ALGORITHMS))}); "
                f"refused: {', '.join(bad)}")
        kw["algorithms"] = algs
    for k, lo in (("leeway", 0), ("max_token_bytes", 256), ("jwks_ttl", 1), ("metadata_ttl", 1),
                  ("max_stale", 0), ("min_refresh_interval", 0), ("device_timeout", 1), ("min_uid", 1),
                  ("max_uid", 1), ("max_token_lifetime", 60)):
        if k in data:
            kw[k] = _int(k, data[k], lo)
    if kw.get("max_uid", 60000) < kw.get("min_uid", 1000):
        raise ConfigError("max_uid", f"expected max_uid >= min_uid ({kw.get('min_uid', 1000)})")
    if kw.get("leeway", 60) > 300:
        raise ConfigError("leeway", "more than 300 seconds of clock skew is not accepted")
    if "max_token_age" in data and data["max_token_age"] is not None:
        kw["max_token_age"] = _int("max_token_age", data["max_token_age"], 1)
    if "http_timeout" in data:
        v = data["http_timeout"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 60:
            raise ConfigError("http_timeout", f"expected a number of seconds in (0, 60], got {v!r}")
        kw["http_timeout"] = float(v)
    for k in ("username_lowercase", "require_local_user"):
        if k in data:
            kw[k] = _bool(k, data[k])
    if "username_regex" in data:
        rx = _str("username_regex", data["username_regex"])
        try:
            re.compile(rx)
        except re.error as e:
            raise ConfigError("username_regex", f"not a valid regular expression: {e}")
        kw["username_regex"] = rx
    if "user_map" in data:
        m = data["user_map"]
        if not isinstance(m, dict) or not all(isinstance(a, str) and isinstance(b, str) and a and b
                                              for a, b in m.items()):
            raise ConfigError("user_map", "expected a mapping of IdP user name -> local user name (strings)")
        bad = [n for pair in m.items() for n in pair if not is_plain_ascii(n)]
        if bad:
            raise ConfigError("user_map", f"names must be plain printable ASCII (look-alikes are refused): "
                                          f"{ascii(bad[0])[:80]}")
        kw["user_map"] = dict(m)
    if data.get("proxy") is not None:
        v = _str("proxy", data["proxy"])
        if not re.match(r"^https?://[^\s/]+(:\d+)?/?$", v):
            raise ConfigError("proxy", "expected http://host:port or http://user:password@host:port "
                                       "(the value is not shown: it may hold a password)")
        kw["proxy"] = v
    if data.get("jwks_uri") is not None:
        kw["jwks_uri"] = _url("jwks_uri", data["jwks_uri"])
    for k in ("client_id", "client_secret", "resource", "log_file"):
        if data.get(k) is not None:
            kw[k] = _str(k, data[k])
    if "scope" in data:
        kw["scope"] = _str("scope", data["scope"])
    if "validate_token" in data:
        if data["validate_token"] not in ("access_token", "id_token"):
            raise ConfigError("validate_token",
                              f"expected 'access_token' or 'id_token', got {data['validate_token']!r}")
        kw["validate_token"] = data["validate_token"]
    return OIDCConfig(**kw)


def load_config(path: str) -> OIDCConfig:
    """Read and validate a YAML configuration file."""
    if not HAS_YAML:
        raise ConfigError("", f"PyYAML is required to read {path}: {YAML_IMPORT_ERROR}")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        raise ConfigError("", f"cannot read configuration {path}: {e.strerror}")
    except UnicodeDecodeError:
        raise ConfigError("", f"configuration {path} is not UTF-8 text")
    # the nesting cap of every YAML file the collection reads (safeyaml): PyYAML recurses per level
    depth = flow_depth(text)
    if depth > MAX_FLOW_DEPTH:
        raise ConfigError("", f"configuration {path} is not valid YAML: nested {depth} levels deep "
                              f"(at most {MAX_FLOW_DEPTH})")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        # only the position: the parser's message may quote part of a secret
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError("", f"configuration {path} is not valid YAML{where}")
    except (RecursionError, ValueError):  # block nesting too deep; an integer of more than 4300 digits
        raise ConfigError("", f"configuration {path} is not valid YAML (nested too deeply or a number too long)")
    return parse_config(data)
