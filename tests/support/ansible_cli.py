# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One module of the collection run for real through the ``ansible`` command: ``ansible localhost -m
gpufleet.reliability.<name> -a <json> -o``, with the ansible-core next to the interpreter running the tests.

Every run gets this process's private Ansible home (ANSIBLE_HOME, ANSIBLE_LOCAL_TEMP, ANSIBLE_REMOTE_TEMP in one
temporary directory, made on first use and removed at exit): two test processes (pytest-xdist workers, two lanes
on one machine) never share ~/.ansible. Its stdin is /dev/null: ansible refuses to start, with nothing on stdout,
when it inherits a stdin that another process has made non-blocking (a terminal or pipe shared with the rest of
the run).
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

REPO = Path(__file__).resolve().parents[2]

_home: tuple[int, str] | None = None  # (pid, directory): a forked child makes its own


def ansible_home() -> str:
    """This process's private Ansible home, made on first use and removed when the process exits."""
    global _home
    if _home is None or _home[0] != os.getpid():
        path = tempfile.mkdtemp(prefix="gpufleet-ansible-home-")
        atexit.register(shutil.rmtree, path, True)
        _home = (os.getpid(), path)
    return _home[1]


def ansible_env(drop_env: Iterable[str] = (), env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an ``ansible`` run: this one, less ``drop_env``, with the collection from the checkout,
    the tests' interpreter for the module, a private Ansible home, and ``env`` on top."""
    drop = set(drop_env)
    home = ansible_home()
    out = {k: v for k, v in os.environ.items() if k not in drop}
    out.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_HOME=home,
               ANSIBLE_LOCAL_TEMP=os.path.join(home, "tmp"), ANSIBLE_REMOTE_TEMP=os.path.join(home, "remote-tmp"))
    out.update(env or {})
    return out


def _unparsed(why: str, argv: list[str], rc: Any, stdout: str, stderr: str) -> AssertionError:
    return AssertionError(f"ansible: {why}\nargv: {argv}\nrc: {rc}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")


def run_module(name: str, args: Mapping[str, Any], *, check: bool = False, verbose: bool = False,
               drop_env: Iterable[str] = (), env: Mapping[str, str] | None = None,
               timeout: float = 120) -> tuple[bool, dict]:
    """Run module ``gpufleet.reliability.<name>`` with ``args``; returns (ok, result).

    ok is True for a SUCCESS or CHANGED result, False for FAILED!; result is the module's JSON result.
    ``check`` adds --check; ``verbose`` adds -vvv (the result then carries the invocation, the module's arguments,
    as AWX job logs do). ``drop_env`` names variables taken out of the environment (e.g. SLURM_CONF), ``env`` sets
    more. Anything else (no output, UNREACHABLE, no JSON) is an AssertionError that shows argv, rc, stdout and
    stderr."""
    argv = [str(Path(sys.executable).parent / "ansible"), "localhost", "-m", f"gpufleet.reliability.{name}",
            "-a", json.dumps(args), "-o"]
    if check:
        argv.append("--check")
    if verbose:
        argv.append("-vvv")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=ansible_env(drop_env, env), cwd=REPO,
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        raise _unparsed(f"no answer within {timeout} s", argv, None, text(exc.stdout), text(exc.stderr)) from None
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise _unparsed("no output", argv, proc.returncode, proc.stdout, proc.stderr)
    status, sep, payload = lines[-1].partition(" => ")
    fields = [f.strip() for f in status.split("|")]
    if not sep or len(fields) != 2 or fields[1] not in ("SUCCESS", "CHANGED", "FAILED!"):
        raise _unparsed("the last line is no 'HOST | STATE => JSON' result", argv, proc.returncode, proc.stdout,
                        proc.stderr)
    try:
        result = json.loads(payload)
    except ValueError as exc:
        raise _unparsed(f"the result is no JSON ({exc})", argv, proc.returncode, proc.stdout, proc.stderr) from None
    return fields[1] != "FAILED!", result
