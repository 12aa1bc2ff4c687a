"""The suite's guard on standard input (tests/conftest.py): a test that closes the test process's fd 0 fails by
name, a test that finds it closed (a fixture's teardown closed it) says so, and the tests after find fd 0 open
again (a daemon started with fd 0 closed loses its log and cannot feed slurmstepd: every job of a lab started after
such a test failed to launch)."""
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_a_test_that_closes_stdin_fails_and_the_next_finds_it_open(tmp_path):
    (tmp_path / "test_fd0.py").write_text(
        "import os\n"
        "def test_closes():\n    os.close(0)\n"
        "def test_after():\n    os.fstat(0)\n"
        "def test_control():\n    os.fstat(0)\n"
        "import pytest\n"
        "@pytest.fixture(scope='module')\ndef closes_at_teardown():\n    yield\n    os.close(0)\n"
        "def test_with_a_fixture_that_closes(closes_at_teardown):\n    pass\n")
    (tmp_path / "test_fd0_next.py").write_text("import os\ndef test_next():\n    os.fstat(0)\n")
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                        "test_fd0.py", "test_fd0_next.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert "ERROR test_fd0.py::test_closes - Failed: this test closed the test process" in r.stdout, r.stdout
    # a module fixture's teardown closed it after the last test of its module: the next test says so
    assert "ERROR test_fd0_next.py::test_next - Failed: the test process's standard input" in r.stdout, r.stdout
    assert "was closed (Bad file descriptor) before this test started" in r.stdout, r.stdout
    assert "4 passed, 2 errors" in r.stdout, r.stdout  # the closing test passes its call and errors at teardown
