"""The suite's guard on standard input (tests/conftest.py): a test that closes the test process's fd 0 fails by
name, and the tests after it find fd 0 open again (a daemon started with fd 0 closed loses its log and cannot feed
slurmstepd: every job of a lab started after such a test failed to launch)."""
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
        "def test_control():\n    os.fstat(0)\n")
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                        "test_fd0.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    assert "ERROR test_fd0.py::test_closes - Failed: this test closed the test process" in r.stdout, r.stdout
    assert "3 passed, 1 error" in r.stdout, r.stdout  # the closing test itself passes its call, errors at teardown
