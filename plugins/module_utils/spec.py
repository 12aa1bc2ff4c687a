# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One small validator for every configuration reader (repair, OIDC, health, startup scripts, the simulator's
scenarios): a value is checked against what its field expects, and a bad one fails with
``<field path>: expected <what>, got <value>``.

Each reader keeps its own exception type (its callers catch it): it passes ``fail``, which turns a field path and a
message into the exception to raise (``raising(RepairError)``, or the OIDC ``ConfigError`` itself, which takes the
key and the reason). Stdlib only, no import of the rest of the collection (a leaf).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterable, List, Optional

Fail = Callable[[str, str], Exception]


class SpecError(ValueError):
    """A value that is not what its field expects; ``where`` is the field's path."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where


def raising(exc_type: Callable[[str], Exception]) -> Fail:
    """A ``fail`` for a reader whose exception takes one message: ``<where>: <message>``."""
    return lambda where, message: exc_type(f"{where}: {message}" if where else message)


def short(value: Any, limit: int = 200) -> str:
    """repr() for an error message: at most ``limit`` characters, and no repr() of a huge integer (Python refuses to
    print more than 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)[:limit]


def _got(value: Any, shown: bool) -> str:
    return short(value) if shown else "(value not shown)"


def mapping(value: Any, where: str, allowed: Optional[Iterable[str]] = None, fail: Fail = SpecError,
            none_ok: bool = True) -> Dict[Any, Any]:
    """A mapping (``None``: an empty one when ``none_ok``); with ``allowed``, a key outside it fails by name."""
    if value is None and none_ok:
        return {}
    if not isinstance(value, Mapping):
        raise fail(where, f"expected a mapping, got {type(value).__name__}")
    if allowed is not None:
        unknown_keys(value, allowed, where, fail)
    return dict(value)


def unknown_keys(value: Mapping, allowed: Iterable[str], where: str, fail: Fail = SpecError) -> None:
    """Fail naming every key of ``value`` outside ``allowed`` (YAML keys may be booleans or numbers: shown as text)."""
    allowed = list(allowed)
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise fail(where, f"unknown key(s) {', '.join(unknown)}; expected some of {', '.join(map(str, allowed))}")


def sequence(value: Any, where: str, fail: Fail = SpecError) -> List[Any]:
    """A list (a YAML sequence)."""
    if not isinstance(value, list):
        raise fail(where, f"expected a list, got {type(value).__name__}")
    return value


def integer(value: Any, where: str, minimum: Optional[int] = None, maximum: Optional[int] = None,
            fail: Fail = SpecError) -> int:
    """An integer (not a boolean), within ``minimum``..``maximum`` where given."""
    if minimum is not None and maximum is not None:
        what = f"an integer from {minimum} to {maximum}"
    elif minimum is not None:
        what = f"an integer >= {minimum}"
    else:
        what = "an integer"
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(where, f"expected {what}, got {short(value)}"[:300])
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise fail(where, f"expected {what}, got {short(value)}")
    return value


def number(value: Any, where: str, minimum: Optional[float] = None, fail: Fail = SpecError) -> float:
    """A finite number (int or float, not a boolean), at least ``minimum`` where given."""
    what = "a number" if minimum is None else f"a number >= {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(where, f"expected {what}, got {short(value)}"[:300])
    if isinstance(value, float) and not math.isfinite(value) or isinstance(value, int) and abs(value) >= 1e300:
        raise fail(where, f"expected a finite number, got {short(value, 60)}")
    if minimum is not None and value < minimum:
        raise fail(where, f"expected {what}, got {short(value)}")
    return float(value)


def boolean(value: Any, where: str, fail: Fail = SpecError) -> bool:
    if not isinstance(value, bool):
        raise fail(where, f"expected true or false, got {short(value)}"[:300])
    return value


def string(value: Any, where: str, empty_ok: bool = False, shown: bool = True, fail: Fail = SpecError) -> str:
    """A string (not blank unless ``empty_ok``); ``shown=False`` keeps a secret's value out of the message."""
    if not isinstance(value, str) or (not empty_ok and not value.strip()):
        what = "a string" if empty_ok else "a non-empty string"
        raise fail(where, f"expected {what}, got {type(value).__name__} {_got(value, shown)}"[:300])
    return value


def choice(value: Any, where: str, options: Iterable[Any], fail: Fail = SpecError) -> Any:
    options = list(options)
    if value not in options:
        raise fail(where, f"expected one of {', '.join(map(str, options))}, got {short(value)}"[:300])
    return value


def string_list(value: Any, where: str, empty_ok: bool = True, scalar_ok: bool = False,
                fail: Fail = SpecError) -> List[str]:
    """A list of non-empty strings; ``scalar_ok``: one string stands for a list of one."""
    if scalar_ok and isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise fail(where, f"expected a list of non-empty strings, got {short(value)}"[:300])
    if not empty_ok and not value:
        raise fail(where, "expected at least one entry")
    return list(value)
