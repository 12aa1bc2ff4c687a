# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Shared test set-up. The collection is importable as ansible_collections.gpufleet.reliability through
# ./collections (made by `make setup`); modules run through Ansible find it through ANSIBLE_COLLECTIONS_PATH.
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / "collections"
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS))
os.environ.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))
# Modules run with the interpreter of the tests, never an interpreter found by discovery (pyenv shims).
os.environ.setdefault("ANSIBLE_PYTHON_INTERPRETER", sys.executable)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

FIXTURES = REPO / "tests" / "fixtures"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


# GPUFLEET_TEST_CPU=DIR: each test's CPU seconds (this process and the children it reaped: Ansible, the agent, the
# commands; not the lab's daemons or what they run) and wall seconds, a line per test in DIR/<pid>.tsv - where the
# CPU of `make test` goes, test by test (CONTRIBUTING.md, "Where the CPU goes").
_CPU_DIR = os.environ.get("GPUFLEET_TEST_CPU")
if _CPU_DIR:
    import resource
    import time

    def _cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        cpu0, wall0 = _cpu(), time.monotonic()
        yield
        os.makedirs(_CPU_DIR, exist_ok=True)
        with open(os.path.join(_CPU_DIR, f"{os.getpid()}.tsv"), "a", encoding="utf-8") as out:
            out.write(f"{item.nodeid}\t{_cpu() - cpu0:.2f}\t{time.monotonic() - wall0:.2f}\n")


# Standard input stays open. A test that closes this process's fd 0 poisons every daemon a later test starts: a
# daemon started with fd 0 closed opens its log file as fd 0 and loses it when it daemonizes (Slurm 22.05's slurmd
# wrote two lines and then nothing), and slurmd then starts slurmstepd on a pipe it does not feed ("Failed to read
# conf from slurmd": no job of that lab could start). The test that closed it fails here, by name; fd 0 is opened
# on /dev/null again for the tests after it.
def _stdin_state() -> str:
    try:
        st = os.fstat(0)
    except OSError as exc:
        return f"closed ({exc.strerror})"
    return f"open (inode {st.st_ino})"


@pytest.fixture(autouse=True)
def _stdin_stays_open():
    before = _stdin_state()
    if before.startswith("closed"):  # a fixture's teardown after the last test, or another thread, closed it
        os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor: 0
        pytest.fail(f"the test process's standard input was {before} before this test started (closed after the "
                    "previous test's own check: a fixture's teardown or another thread); opened again on /dev/null")
    yield
    after = _stdin_state()
    if after.startswith("closed"):
        os.open(os.devnull, os.O_RDONLY)
        pytest.fail(f"this test closed the test process's standard input (fd 0 was {before}, is {after}); daemons "
                    "started after it would start without one")
