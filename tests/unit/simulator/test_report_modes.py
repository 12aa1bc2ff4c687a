# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet-sim's outputs get the mode of any new file (0666 less the umask), the same as its PNGs: a report
shared on a web server or a group directory is readable as the umask says, not 0600."""
import os
import stat
import subprocess
import sys

import pytest

SCENARIOS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "simulator", "scenarios")


# Each umask is a fresh interpreter rendering the PNG report (~2 s): the common 022 runs in the edit loop (it already
# fails on a fixed 0600), the other two only in `make test`.
@pytest.mark.parametrize("umask", [0o022, pytest.param(0o002, marks=pytest.mark.slow),
                                   pytest.param(0o077, marks=pytest.mark.slow)])
def test_outputs_follow_the_umask(tmp_path, umask):
    out = tmp_path / "out"
    code = (f"import os, sys; os.umask({umask}); from gpufleet_sim.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "run", os.path.join(SCENARIOS, "default-1k.yaml"), "--seeds", "1",
                        "--policy", "reactive-auto", "reactive-manual", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert {"report.html", "results.csv", "results.json"} <= set(modes) and any(n.endswith(".png") for n in modes)
    assert set(modes.values()) == {0o666 & ~umask}, {n: oct(m) for n, m in modes.items()}
    assert not [n for n in modes if n.startswith(".")]  # no temporary file left behind
