# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Helpers for the startup runner tests: write NAME + NAME.json pairs into a scripts directory.
import json
import os

import pytest


class ScriptsDir:
    def __init__(self, root):
        self.path = root / "scripts.d"
        self.path.mkdir()
        self.state = root / "state"
        self.root = root

    def add(self, name, body, shebang="#!/usr/bin/env bash", **meta):
        script = self.path / name
        script.write_text(shebang + "\n" + body + "\n")
        os.chmod(script, 0o755)
        (self.path / (name + ".json")).write_text(json.dumps(dict(meta, name=name)))
        return script

    def argv(self, *extra):
        return ["run", "--scripts-dir", str(self.path), "--state-dir", str(self.state), "--quiet",
                "--json", str(self.root / "report.json"), *extra]

    def report(self):
        return json.loads((self.root / "report.json").read_text())


@pytest.fixture
def scripts(tmp_path):
    return ScriptsDir(tmp_path)


def _alive(pid):
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@pytest.fixture
def alive():
    return _alive
