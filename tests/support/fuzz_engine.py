# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small mutation fuzzer for the parsers that read untrusted text (stdlib only).

Input ``i`` of a target is a pure function of (target name, campaign seed, i): stacked random mutations of
one genuine input (tests/fixtures and friends), so any finding is reproduced from its index alone, and the
minimal input is written next to the table. Each input runs under a per-input CPU-time deadline, with
tracemalloc watching the peak allocated memory of that one input; the whole process runs under an address-space
limit (RLIMIT_AS) so that an allocation storm ends as a MemoryError (a finding), never as a dead machine.

(tracemalloc slows a parser four- to fivefold, so it measures every genuine input and a sample of the
mutated ones; the address-space limit covers every input.)

A *finding* is any exception that is not the parser's own documented error type, a broken property the
harness asserts (``AssertionError``), a hang past the deadline or an input whose peak memory passes the limit.
"""
from __future__ import annotations

import hashlib
import os
import random
import signal
import sys
import time
import traceback
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

# numbers and tokens that tend to break parsers
INTERESTING = [b"0", b"-1", b"1", b"255", b"256", b"65535", b"65536", b"2147483647", b"-2147483648",
               b"4294967296", b"9223372036854775807", b"18446744073709551616", b"99999999999999999999999999",
               b"1e308", b"1e309", b"-1e309", b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf", b".inf", b"-.nan",
               b"0x7fffffff", b"0xffffffffffffffff", b"1.5", b"-0", b"00", b"1_000", b"\xd9\xa3", b"\xef\xbc\x91"]
GENERIC = [b"\x00", b"\n", b"\r\n", b"\r", b"\t", b" ", b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x80\xa8", b"\xc2\x85",
           b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x1f", b"\\", b"\"", b"'", b"#", b"=", b",", b":", b";",
           b"[", b"]", b"{", b"}", b"(", b")", b"<", b">", b"&", b"%s", b"%n", b"${", b"$(", b"*", b"?",
           b"\xf0\x9f\x92\xa5", b"\xed\xa0\x80", b"null", b"true", b"false", b"(null)", b"N/A", b"None"]


class Hang(BaseException):
    """Raised by the SIGVTALRM handler when one input uses more CPU time than its deadline (BaseException: never
    caught by a parser's ``except Exception``). CPU time, not wall time: a busy shared machine is no hang."""


@dataclass
class Target:
    """One parser under fuzz. ``run(data)`` feeds it one input and asserts its properties; ``expected`` are the
    exception types the parser documents for bad input."""
    name: str
    run: Callable[[bytes], None]
    seeds: List[bytes]
    expected: Tuple[type, ...] = ()
    tokens: Sequence[bytes] = ()
    max_len: int = 64 * 1024
    # a structured mutator: (rng, seed bytes) -> bytes, used for a share of the inputs when given
    structured: Optional[Callable[[random.Random, bytes], bytes]] = None
    setup: Optional[Callable[[], None]] = None


@dataclass
class Finding:
    target: str
    kind: str  # crash | property | hang | memory
    signature: str
    index: int
    error: str
    data: bytes
    where: str = ""
    count: int = 1
    minimized: bool = False


@dataclass
class Result:
    target: str
    inputs: int = 0
    seconds: float = 0.0
    findings: Dict[str, Finding] = field(default_factory=dict)
    slowest_ms: float = 0.0


# ----------------------------------------------------------------------------------------------- mutation
def _rand_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _unused in range(n))


def _span(rng: random.Random, data: bytes) -> Tuple[int, int]:
    if not data:
        return 0, 0
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.choice((1, 1, 2, 4, 8, 16, 64, 256)))
    return a, b


def _line_op(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    if len(lines) < 2:
        return data
    op = rng.randrange(4)
    i = rng.randrange(len(lines))
    if op == 0:
        del lines[i]
    elif op == 1:
        lines.insert(rng.randrange(len(lines)), lines[i])
    elif op == 2:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    return b"\n".join(lines)


def _numbers(rng: random.Random, data: bytes) -> bytes:
    """Replace one run of digits with an interesting number."""
    starts = [i for i in range(len(data)) if 48 <= data[i] <= 57 and (i == 0 or not 48 <= data[i - 1] <= 57)]
    if not starts:
        return data
    a = rng.choice(starts)
    b = a
    while b < len(data) and (48 <= data[b] <= 57 or data[b] == 46):
        b += 1
    return data[:a] + rng.choice(INTERESTING) + data[b:]


def mutate(rng: random.Random, data: bytes, target: Target, depth: int) -> bytes:
    tokens = list(target.tokens) + GENERIC + INTERESTING
    for _unused in range(depth):
        op = rng.randrange(14)
        a, b = _span(rng, data)
        if op == 0 and data:  # flip a bit
            i = rng.randrange(len(data))
            data = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
        elif op == 1:  # random bytes
            data = data[:a] + _rand_bytes(rng, rng.randrange(1, 9)) + data[a:]
        elif op == 2:  # delete
            data = data[:a] + data[b:]
        elif op == 3:  # duplicate a span
            data = data[:b] + data[a:b] + data[b:]
        elif op in (4, 5):  # dictionary token
            tok = rng.choice(tokens)
            data = data[:a] + tok + (data[a:] if rng.random() < 0.5 else data[b:])
        elif op == 6:
            data = _numbers(rng, data)
        elif op in (7, 8):
            data = _line_op(rng, data)
        elif op == 9:  # splice with another genuine input
            other = rng.choice(target.seeds)
            c = rng.randrange(len(other) + 1)
            data = data[:a] + other[c:c + rng.randrange(1, 512)] + data[b:]
        elif op == 10:  # truncate
            data = data[: rng.randrange(len(data) + 1)]
        elif op == 11:  # repeat a short span many times (long lines, deep nesting)
            chunk = data[a:min(b, a + 8)] or rng.choice(tokens)
            data = data[:a] + chunk * rng.choice((16, 256, 4096, 20000)) + data[a:]
        elif op == 12:  # nesting
            opener = rng.choice((b"[", b"{\"a\":", b"- ", b"<a>", b"(", b"[[", b"{a: "))
            data = data[:a] + opener * rng.choice((64, 1000, 5000)) + data[a:]
        else:  # change case / replace a byte by a token char
            data = data[:a] + data[a:b].swapcase() + data[b:]
        if len(data) > target.max_len:
            data = data[: target.max_len]
    return data


def make_input(target: Target, seed: int, index: int) -> bytes:
    rng = random.Random(f"{seed}:{target.name}:{index}")
    base = rng.choice(target.seeds)
    if index < len(target.seeds):
        return target.seeds[index]  # the genuine inputs themselves first: controls
    if target.structured is not None and rng.random() < 0.5:
        try:
            data = target.structured(rng, base)
        except Exception:  # noqa: BLE001 - the harness could not write that tree back: mutate the bytes instead
            return mutate(rng, base, target, 2)
        if rng.random() < 0.3:
            data = mutate(rng, data, target, rng.randrange(1, 3))
        return data[: target.max_len]
    return mutate(rng, base, target, rng.choice((1, 1, 2, 2, 3, 4, 6, 8)))


# ----------------------------------------------------------------------------------------------- running
def _alarm(_signum, _frame):
    raise Hang()


def _where(tb) -> str:
    """file:line of the innermost frame in the project (not the harness, not a library)."""
    best = ""
    for fr in traceback.extract_tb(tb):
        fn = fr.filename
        if "/tests/support/" in fn or "/tests/fuzz/" in fn:  # the harness and its driver
            continue
        if "/plugins/" in fn or "/simulator/" in fn:
            parts = fn.split("/")
            for anchor in ("plugins", "simulator"):
                if anchor in parts:
                    fn = "/".join(parts[parts.index(anchor):])
                    break
            best = f"{fn}:{fr.lineno}"
    return best


def classify(target: Target, data: bytes, deadline_s: float, mem_limit: int,
             trace: bool = False) -> Optional[Tuple[str, str, str, str]]:
    """Run one input. None when fine, else (kind, signature, error text, where). With ``trace``, tracemalloc
    measures the input's peak allocation (it slows a parser four- to fivefold, so the campaign samples)."""
    if trace:
        tracemalloc.start(1)
    signal.setitimer(signal.ITIMER_VIRTUAL, deadline_s)
    try:
        target.run(data)
    except Hang:
        return "hang", "hang", f"no answer within {deadline_s:g} s", ""
    except target.expected:
        pass
    except MemoryError as exc:
        where = _where(exc.__traceback__)
        return "memory", f"MemoryError@{where}", "MemoryError", where
    except AssertionError as exc:
        where = _where(exc.__traceback__)
        msg = str(exc).splitlines()[0][:200] if str(exc) else "assertion"
        return "property", f"property:{msg[:60]}", msg, where
    except Exception as exc:  # noqa: BLE001 - anything else is what we look for
        where = _where(exc.__traceback__)
        return "crash", f"{type(exc).__name__}@{where}", f"{type(exc).__name__}: {str(exc)[:200]}", where
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        if trace:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    if trace and peak > mem_limit:
        return "memory", "memory", f"peak {peak // 1024} KiB for a {len(data)} byte input", ""
    return None


def minimize(target: Target, data: bytes, signature: str, deadline_s: float, mem_limit: int,
             budget_s: float = 20.0) -> bytes:
    """Greedy delta reduction that keeps the finding's signature."""
    if signature in ("hang", "memory"):
        budget_s = min(budget_s, 4 * deadline_s + 2)
    t_end = time.monotonic() + budget_s

    def same(d: bytes) -> bool:
        got = classify(target, d, deadline_s, mem_limit, trace=signature == "memory")
        return got is not None and got[1] == signature

    chunk = max(1, len(data) // 2)
    while chunk >= 1 and time.monotonic() < t_end:
        i, shrunk = 0, False
        while i < len(data) and time.monotonic() < t_end:
            cand = data[:i] + data[i + chunk:]
            if same(cand):
                data, shrunk = cand, True
            else:
                i += chunk
        if not shrunk:
            chunk //= 2
    return data


def limit_address_space(extra_mib: int) -> None:
    """Cap the address space at what is mapped now plus ``extra_mib``: an allocation storm ends as MemoryError."""
    try:
        import resource
        with open("/proc/self/status", encoding="ascii") as fh:
            vm = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:"))
        cap = (vm + extra_mib * 1024) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
    except (OSError, ValueError, StopIteration, ImportError):
        pass


def run_target(target: Target, n: int, seed: int = 0, deadline_s: float = 2.0, mem_limit_mib: int = 64,
               start: int = 0, progress: Optional[Callable[[int], None]] = None,
               minimize_budget_s: float = 20.0, mem_every: int = 64, budget_s: float = 0.0) -> Result:
    """Feed ``n`` inputs (indexes start..start+n-1) to ``target``; returns the counts and unique findings.
    Every ``mem_every``-th input (and every genuine seed) runs under tracemalloc against ``mem_limit_mib``.
    ``budget_s`` > 0 stops the run after that many seconds (the inputs fed so far are what the result counts)."""
    if target.setup is not None:
        target.setup()
    res = Result(target.name)
    mem_limit = mem_limit_mib * 1024 * 1024
    old = signal.signal(signal.SIGVTALRM, _alarm)
    t0 = time.perf_counter()
    try:
        for i in range(start, start + n):
            if budget_s and time.perf_counter() - t0 > budget_s:
                break
            if progress is not None:
                progress(i)
            data = make_input(target, seed, i)
            t1 = time.perf_counter()
            trace = i < len(target.seeds) or (mem_every > 0 and i % mem_every == 0)
            got = classify(target, data, deadline_s, mem_limit, trace)
            res.slowest_ms = max(res.slowest_ms, (time.perf_counter() - t1) * 1000.0)
            res.inputs += 1
            if got is None:
                continue
            kind, sig, err, where = got
            if sig in res.findings:
                res.findings[sig].count += 1
                continue
            small = minimize(target, data, sig, deadline_s, mem_limit, minimize_budget_s)
            res.findings[sig] = Finding(target.name, kind, sig, i, err, small, where, minimized=True)
    finally:
        res.seconds = time.perf_counter() - t0
        signal.signal(signal.SIGVTALRM, old)
    return res


def finding_id(f: Finding) -> str:
    return hashlib.sha256(f"{f.target}:{f.signature}".encode()).hexdigest()[:12]


def read(path: Path) -> bytes:
    return path.read_bytes()


def fixtures(*globs: str) -> List[Path]:
    out: List[Path] = []
    for g in globs:
        out.extend(sorted(FIXTURES.glob(g)))
    return out


def stderr(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default
