# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Claims -> local user mapping and the group/role gate.

Mapping: take ``username_claim``; refuse it unless it is plain printable ASCII (checked *before* any
folding: ``"sec\\u212aate".lower() == "seckate"`` with U+212A KELVIN SIGN, and ``casefold()`` or NFKC map
long s, ligatures and full-width letters onto ASCII names too, so none of them is ever applied to an
identity); a ``user@domain`` name keeps only ``user`` when ``domain`` is in ``allowed_domains`` and is
refused for any other domain; fold A-Z to a-z when ``username_lowercase``; apply ``user_map`` (keys
compared after the same steps); the result must fully match ``username_regex``. ``root``,
``denied_users`` and local system accounts (uid below ``min_uid`` or above ``max_uid``, uid 0 always)
are refused.

Gate: the ``groups_claim`` value (a list, or one string) must contain any (``groups_match:
any``) or all (``all``) of ``allowed_groups`` and none of ``denied_groups``.
"""
from __future__ import annotations

import pwd
import re
from typing import Any, Dict, List, Optional

from .config import OIDCConfig, fold_ascii
from .errors import NotAuthorised
from .transport import is_plain_ascii


def _normalise(cfg: OIDCConfig, name: str) -> str:
    """The local-name candidate for an IdP user name; raises NotAuthorised for a look-alike or foreign domain."""
    if not is_plain_ascii(name):
        raise NotAuthorised(f"user name claim {ascii(name)[:80]} is not plain ASCII (look-alike names are refused)")
    if cfg.allowed_domains and "@" in name:
        local, _sep, domain = name.rpartition("@")
        if fold_ascii(domain) not in {fold_ascii(d) for d in cfg.allowed_domains}:
            raise NotAuthorised(f"user name domain {domain[:64]!r} is not in allowed_domains")
        name = local
    if cfg.username_lowercase:
        name = fold_ascii(name)
    return name


def map_user(cfg: OIDCConfig, claims: Dict[str, Any]) -> str:
    raw = claims.get(cfg.username_claim)
    if not isinstance(raw, str) or not raw:
        raise NotAuthorised(f"claim {cfg.username_claim!r} missing or not a string")
    if raw in cfg.user_map:  # an exact entry is the site's explicit decision (keys are plain ASCII: config.py)
        name = cfg.user_map[raw]
    else:
        name = _normalise(cfg, raw)
        for remote, local in cfg.user_map.items():
            try:
                if _normalise(cfg, remote) == name:
                    name = local
                    break
            except NotAuthorised:
                continue  # a key for a domain that is not allowed only matches exactly (above)
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
    if pw is not None and not cfg.min_uid <= pw.pw_uid <= cfg.max_uid:
        raise NotAuthorised(f"user {name!r} is a system account (uid {pw.pw_uid} outside min_uid {cfg.min_uid}"
                            f"..max_uid {cfg.max_uid}) and is denied")
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
    # a denial is case-blind (an IdP that spells "Contractors" differently must not let a denied user in); an
    # allowance is exact (a look-alike group never grants access)
    deny = {g.casefold() for g in cfg.denied_groups}
    denied = {g for g in groups if g.casefold() in deny}
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
