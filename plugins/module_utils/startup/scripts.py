# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Startup script metadata, shared by the startup_script module and the runner.

A scripts directory holds, for each script NAME, two files side by side:

- ``NAME``       the script itself (mode 0755, starts with a shebang);
- ``NAME.json``  its metadata (see :class:`ScriptMeta`), written after the script, removed before it.

The runner only runs scripts that have a metadata file. Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .. import spec

PHASES = ("boot", "every_boot", "once")
NODE_ROLES = ("worker", "login", "controller")
META_SUFFIX = ".json"
META_VERSION = 1

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

DEFAULTS: Dict[str, Any] = {
    "order": 50,
    "phase": "every_boot",
    "timeout": 300,
    "retries": 0,
    "retry_delay": 5,
    "optional": False,
    "environment": {},
    "roles": list(NODE_ROLES),
}


class MetaError(ValueError):
    """Bad script metadata; the message names the field and what was expected."""


@dataclass(frozen=True)
class ScriptMeta:
    name: str
    order: int = 50
    phase: str = "every_boot"
    timeout: int = 300
    retries: int = 0
    retry_delay: int = 5
    optional: bool = False
    environment: Dict[str, str] = field(default_factory=dict)
    roles: Tuple[str, ...] = NODE_ROLES

    def to_dict(self) -> Dict[str, Any]:
        return {
            "version": META_VERSION,
            "name": self.name,
            "order": self.order,
            "phase": self.phase,
            "timeout": self.timeout,
            "retries": self.retries,
            "retry_delay": self.retry_delay,
            "optional": self.optional,
            "environment": dict(sorted(self.environment.items())),
            "roles": list(self.roles),
        }

    def to_json(self) -> str:
        """Canonical text (sorted keys, trailing newline): equal metadata gives equal bytes."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @property
    def sort_key(self) -> Tuple[int, str]:
        return (self.order, self.name)


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or name.endswith(META_SUFFIX):
        raise MetaError(
            "name: expected 1-128 characters of letters, digits and '_.@+-', starting with a letter or digit "
            f"and not ending in '{META_SUFFIX}', got {name!r}"
        )
    return name


_FAIL = spec.raising(MetaError)


def _int(data: Dict[str, Any], key: str, minimum: int, maximum: int) -> int:
    return spec.integer(data.get(key, DEFAULTS[key]), key, minimum, maximum, fail=_FAIL)


def meta_from_dict(data: Any, source: str = "metadata") -> ScriptMeta:
    """Validate a metadata mapping; errors say ``<source>: <field>: expected ..., got ...``."""
    try:
        if not isinstance(data, dict):
            raise MetaError(f"expected a JSON object, got {type(data).__name__}")
        spec.unknown_keys(data, ["name", "version", *sorted(DEFAULTS)], "", fail=_FAIL)
        name = validate_name(data.get("name"))
        phase = spec.choice(data.get("phase", DEFAULTS["phase"]), "phase", PHASES, fail=_FAIL)
        optional = spec.boolean(data.get("optional", DEFAULTS["optional"]), "optional", fail=_FAIL)
        env = data.get("environment", DEFAULTS["environment"])
        if env is None:
            env = {}
        if not isinstance(env, dict):
            raise MetaError(f"environment: expected a mapping of variable name to string, got {env!r}")
        clean_env: Dict[str, str] = {}
        for key, value in env.items():
            if not isinstance(key, str) or not _ENV_KEY_RE.match(key):
                raise MetaError(f"environment: variable name {key!r} is not a valid shell variable name")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise MetaError(f"environment.{key}: expected a string, got {value!r}")
            clean_env[key] = str(value)
        roles = data.get("roles", DEFAULTS["roles"])
        if isinstance(roles, str):
            roles = [roles]
        if not isinstance(roles, (list, tuple)) or not roles or any(r not in NODE_ROLES for r in roles):
            raise MetaError("roles: expected a non-empty list from {}, got {!r}".format(", ".join(NODE_ROLES), roles))
        ordered_roles = tuple(r for r in NODE_ROLES if r in roles)
        return ScriptMeta(
            name=name,
            order=_int(data, "order", 0, 99999),
            phase=phase,
            timeout=_int(data, "timeout", 1, 7 * 24 * 3600),
            retries=_int(data, "retries", 0, 100),
            retry_delay=_int(data, "retry_delay", 0, 3600),
            optional=optional,
            environment=clean_env,
            roles=ordered_roles,
        )
    except MetaError as exc:
        raise MetaError(f"{source}: {exc}") from None


def meta_path(scripts_dir: str, name: str) -> str:
    return os.path.join(scripts_dir, name + META_SUFFIX)


def load_meta(path: str) -> ScriptMeta:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise MetaError(f"{path}: cannot read metadata: {exc}") from None
    meta = meta_from_dict(data, source=path)
    expected = os.path.basename(path)[: -len(META_SUFFIX)]
    if meta.name != expected:
        raise MetaError(f"{path}: name: expected {expected!r} (the file name without {META_SUFFIX}), got {meta.name!r}")
    return meta


def discover(scripts_dir: str) -> Tuple[List[ScriptMeta], List[str]]:
    """Return (scripts sorted by (order, name), errors). A metadata file without its script is an error."""
    metas: List[ScriptMeta] = []
    errors: List[str] = []
    try:
        entries = sorted(os.listdir(scripts_dir))
    except OSError as exc:
        return [], [f"{scripts_dir}: cannot list scripts directory: {exc.strerror or exc}"]
    for entry in entries:
        if not entry.endswith(META_SUFFIX) or entry.startswith("."):
            continue
        path = os.path.join(scripts_dir, entry)
        try:
            meta = load_meta(path)
        except MetaError as exc:
            errors.append(str(exc))
            continue
        script = os.path.join(scripts_dir, meta.name)
        if not os.path.isfile(script):
            errors.append(f"{path}: script {script} is missing")
            continue
        metas.append(meta)
    metas.sort(key=lambda m: m.sort_key)
    return metas, errors


def unmanaged(scripts_dir: str) -> List[str]:
    """Files in the scripts directory that have no ``NAME.json``: never run (the metadata says when, for which
    roles, with which timeout), so the runner warns about each and counts them. Hidden files are the writers'
    temporary files and are not listed."""
    try:
        entries = sorted(os.listdir(scripts_dir))
    except OSError:
        return []  # discover() reports the directory error
    described = {e[: -len(META_SUFFIX)] for e in entries if e.endswith(META_SUFFIX)}
    return [e for e in entries
            if not e.startswith(".") and not e.endswith(META_SUFFIX) and e not in described
            and not os.path.isdir(os.path.join(scripts_dir, e))]


def shebang(content: bytes) -> Optional[List[str]]:
    """The interpreter command of a script (``['/usr/bin/env', 'bash']``), or None without a shebang."""
    first = content.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    return words or None


def interpreter_name(words: List[str]) -> str:
    """The interpreter's base name, looking through ``/usr/bin/env [-S] X``."""
    prog = os.path.basename(words[0])
    if prog == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        if rest:
            prog = os.path.basename(rest[0])
    return prog
