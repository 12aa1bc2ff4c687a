# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Claims -> local user mapping and the group/role gate.

Mapping: take ``username_claim``; strip a domain (``user@corp.example`` -> ``user``) when the
domain is listed in ``username_strip_domains`` (``*`` = any); lower-case it when
``username_lowercase``; apply ``user_map`` (keys compared after the same normalisation);
the result must fully match ``username_regex``. ``root`` (and any uid 0 account) and
``denied_users`` are always refused.

Gate: the ``groups_claim`` value (a list, or one string) must contain any (``groups_match:
any``) or all (``all``) of ``allowed_groups`` and none of ``denied_groups``.
"""
from __future__ import annotations

import pwd
import re
from typing import Any, Dict, List, Optional

from .config import OIDCConfig
from .errors import NotAuthorised


def _normalise(cfg: OIDCConfig, name: str) -> str:
    if "@" in name and cfg.username_strip_domains:
        local, _sep, domain = name.rpartition("@")
        if "*" in cfg.username_strip_domains or domain.lower() in {d.lower() for d in cfg.username_strip_domains}:
            name = local
    if cfg.username_lowercase:
        name = name.lower()
    return name


def map_user(cfg: OIDCConfig, claims: Dict[str, Any]) -> str:
    raw = claims.get(cfg.username_claim)
    if not isinstance(raw, str) or not raw:
        raise NotAuthorised(f"claim {cfg.username_claim!r} missing or not a string")
    name = _normalise(cfg, raw)
    mapped = None
    for remote, local in cfg.user_map.items():
        if remote == raw or _normalise(cfg, remote) == name:
            mapped = local
            break
    if mapped is not None:
        name = mapped
    if not re.fullmatch(cfg.username_regex, name):
        raise NotAuthorised(f"mapped user name {name[:64]!r} does not match username_regex")
    if name in cfg.denied_users or name == "root":
        raise NotAuthorised(f"user {name!r} is denied")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        pw = None
    if pw is not None and pw.pw_uid == 0:
        raise NotAuthorised(f"user {name!r} has uid 0 and is denied")
    if cfg.require_local_user and pw is None:
        raise NotAuthorised(f"no local account {name!r}")
    return name


def claim_groups(cfg: OIDCConfig, claims: Dict[str, Any]) -> List[str]:
    v = claims.get(cfg.groups_claim)
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return [g for g in v if isinstance(g, str)]
    return []


def check_groups(cfg: OIDCConfig, claims: Dict[str, Any]) -> None:
    groups = set(claim_groups(cfg, claims))
    denied = groups & set(cfg.denied_groups)
    if denied:
        raise NotAuthorised(f"member of denied group {sorted(denied)[0]!r}")
    allowed = set(cfg.allowed_groups)
    if cfg.groups_match == "all":
        missing = allowed - groups
        if missing:
            raise NotAuthorised(f"not in required group(s) {', '.join(sorted(missing))} ({cfg.groups_claim})")
    elif not groups & allowed:
        raise NotAuthorised(f"not in any allowed group ({cfg.groups_claim}: {', '.join(sorted(allowed))})")


def authorise(cfg: OIDCConfig, claims: Dict[str, Any], login_user: Optional[str] = None) -> str:
    """Map the claims to a local user, apply the gate and (for PAM) compare with the login user."""
    user = map_user(cfg, claims)
    if login_user is not None and user != login_user:
        raise NotAuthorised(f"token user {user!r} != login user {login_user!r}")
    check_groups(cfg, claims)
    return user
