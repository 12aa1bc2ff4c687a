"""Duration and rate distributions used by scenarios.

A duration is written in a scenario either as a plain number (a fixed value) or as a mapping::

    {dist: exponential, mean: 30}
    {dist: lognormal, median: 10, p90: 25}
    {dist: uniform, low: 5, high: 15}
    {dist: weibull, shape: 1.5, scale: 60}
    {dist: fixed, value: 10}

The unit is the one the field's name carries (``*_min`` minutes, ``*_h`` hours, ``*_days`` days).
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

from ansible_collections.gpufleet.reliability.plugins.module_utils import spec as checks

Z90 = 1.2815515655446004  # standard normal 90th percentile

Sampler = Callable[[random.Random], float]


class SpecError(ValueError):
    """A scenario field is wrong; the message names the field and what was expected."""


def short_repr(value: Any) -> str:
    """repr() for an error message: at most 60 characters, no repr() of a huge integer."""
    return checks.short(value, 60)


def _num(path: str, value: Any, *, positive: bool = False, allow_zero: bool = True) -> float:
    v = checks.number(value, path, fail=checks.raising(SpecError))  # a finite number (the one validator's check)
    if positive and (v < 0 or (v == 0 and not allow_zero)):
        raise SpecError(f"{path}: expected a number {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return v


def parse_duration(path: str, spec: Any) -> tuple[Sampler, float]:
    """Return (sampler, mean) for a duration spec; raise SpecError naming `path` when it is wrong."""
    if not isinstance(spec, dict):
        v = _num(path, spec, positive=True)
        return (lambda _r, v=v: v), v
    kind = spec.get("dist")
    allowed = {
        "fixed": {"value"},
        "exponential": {"mean"},
        "lognormal": {"median", "p90", "sigma"},
        "uniform": {"low", "high"},
        "weibull": {"shape", "scale"},
    }
    if not isinstance(kind, str) or kind not in allowed:  # a mapping or list here is unhashable
        raise SpecError(f"{path}.dist: expected one of {sorted(allowed)}, got {kind!r}")
    extra = set(spec) - allowed[kind] - {"dist"}
    if extra:
        raise SpecError(f"{path}: unknown key(s) {sorted(extra)} for dist {kind}; expected {sorted(allowed[kind])}")
    if kind == "fixed":
        v = _num(f"{path}.value", spec.get("value"), positive=True)
        return (lambda _r, v=v: v), v
    if kind == "exponential":
        m = _num(f"{path}.mean", spec.get("mean"), positive=True, allow_zero=False)
        return (lambda r, m=m: r.expovariate(1.0 / m)), m
    if kind == "lognormal":
        med = _num(f"{path}.median", spec.get("median"), positive=True, allow_zero=False)
        if "sigma" in spec:
            sigma = _num(f"{path}.sigma", spec["sigma"], positive=True)
        elif "p90" in spec:
            p90 = _num(f"{path}.p90", spec["p90"], positive=True)
            if p90 < med:
                raise SpecError(f"{path}.p90: expected a value >= median ({med}), got {p90}")
            sigma = math.log(p90 / med) / Z90
        else:
            raise SpecError(f"{path}: lognormal needs p90 or sigma next to median")
        mu = math.log(med)
        try:
            mean = math.exp(mu + sigma * sigma / 2)
        except OverflowError:
            mean = math.inf
        if not math.isfinite(mean):
            raise SpecError(f"{path}: the lognormal's mean overflows (sigma {sigma:g}; p90 / median too large)")
        return (lambda r, mu=mu, s=sigma: r.lognormvariate(mu, s)), mean
    if kind == "uniform":
        lo = _num(f"{path}.low", spec.get("low"), positive=True)
        hi = _num(f"{path}.high", spec.get("high"), positive=True)
        if hi < lo:
            raise SpecError(f"{path}.high: expected a value >= low ({lo}), got {hi}")
        return (lambda r, lo=lo, hi=hi: r.uniform(lo, hi)), (lo + hi) / 2
    k = _num(f"{path}.shape", spec.get("shape"), positive=True, allow_zero=False)
    lam = _num(f"{path}.scale", spec.get("scale"), positive=True, allow_zero=False)
    try:
        mean = lam * math.gamma(1 + 1 / k)
    except OverflowError:
        raise SpecError(f"{path}.shape: expected a larger shape, the mean overflows with {k:g}")
    if math.isinf(mean):
        raise SpecError(f"{path}: the weibull's mean overflows (scale {lam:g}, shape {k:g})")
    return (lambda r, lam=lam, k=k: r.weibullvariate(lam, k)), mean


# Student t 97.5 % quantiles for 95 % two-sided confidence intervals (df 1..30), then the normal value.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t975(df: int) -> float:
    if df <= 0:
        return float("nan")
    if df <= 30:
        return _T975[df - 1]
    if df <= 60:
        return 2.042 - (df - 30) * (2.042 - 2.000) / 30
    if df <= 120:
        return 2.000 - (df - 60) * (2.000 - 1.980) / 60
    return 1.96


def neg_ci(ci: dict) -> dict:
    """The mean and CI of the opposite difference (b - a from a - b)."""
    return {"mean": -ci["mean"], "ci95": [-ci["ci95"][1], -ci["ci95"][0]]}


def mean_ci(values: list[float]) -> dict:
    """Mean and 95 % confidence interval (Student t) of per-seed values."""
    n = len(values)
    if n == 0:
        return {"mean": None, "ci95": [None, None]}
    m = sum(values) / n
    if n == 1:
        return {"mean": m, "ci95": [m, m]}
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    h = t975(n - 1) * math.sqrt(var / n)
    return {"mean": m, "ci95": [m - h, m + h]}
