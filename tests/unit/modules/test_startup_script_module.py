# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# The startup_script module run for real through Ansible: pytest-ansible's `localhost` for plain calls,
# ansible-runner for check mode and diff mode (the pytest-ansible dispatcher has no per-call check/diff).
import json
import os
import stat
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
MODULE = "gpufleet.reliability.startup_script"
GOOD = "#!/usr/bin/env bash\nset -euo pipefail\necho ready\n"


def startup_script(host, **kwargs):
    return getattr(host, MODULE)(**kwargs)["localhost"]


@pytest.fixture
def sdir(tmp_path):
    return tmp_path / "startup.d"


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_install_is_idempotent(localhost, sdir):
    res = startup_script(localhost, name="20-ready.sh", content=GOOD, order=20, phase="once", timeout=60,
                         retries=2, environment={"SITE": "eu-1"}, roles=["worker"], scripts_dir=str(sdir))
    assert res.is_successful, res
    assert res["changed"] is True and res["interpreter"] == "bash"
    assert (sdir / "20-ready.sh").read_text() == GOOD
    assert mode(sdir / "20-ready.sh") == 0o755 and mode(sdir / "20-ready.sh.json") == 0o644
    meta = json.loads((sdir / "20-ready.sh.json").read_text())
    assert meta == {"version": 1, "name": "20-ready.sh", "order": 20, "phase": "once", "timeout": 60, "retries": 2,
                    "retry_delay": 5, "optional": False, "environment": {"SITE": "eu-1"}, "roles": ["worker"]}
    again = startup_script(localhost, name="20-ready.sh", content=GOOD, order=20, phase="once", timeout=60,
                           retries=2, environment={"SITE": "eu-1"}, roles=["worker"], scripts_dir=str(sdir))
    assert again.is_successful and again["changed"] is False
    # the files left behind are exactly the pair: no temp files
    assert sorted(os.listdir(sdir)) == ["20-ready.sh", "20-ready.sh.json"]


def test_metadata_change_and_mode_drift_are_changes(localhost, sdir):
    assert startup_script(localhost, name="a", content=GOOD, scripts_dir=str(sdir))["changed"] is True
    res = startup_script(localhost, name="a", content=GOOD, order=7, scripts_dir=str(sdir))
    assert res["changed"] is True and json.loads((sdir / "a.json").read_text())["order"] == 7
    os.chmod(sdir / "a", 0o644)
    res = startup_script(localhost, name="a", content=GOOD, order=7, scripts_dir=str(sdir))
    assert res["changed"] is True and mode(sdir / "a") == 0o755
    assert startup_script(localhost, name="a", content=GOOD, order=7, scripts_dir=str(sdir))["changed"] is False


def test_syntax_error_is_refused_with_a_clear_message(localhost, sdir):
    bad = "#!/usr/bin/env bash\nif true; then\n  echo half\n"
    res = startup_script(localhost, name="10-bad.sh", content=bad, scripts_dir=str(sdir))
    assert res.is_failed
    assert "startup_script 10-bad.sh: syntax check (bash -n) failed, script not installed" in res["msg"]
    assert "10-bad.sh: line 4: syntax error" in res["msg"]
    assert not (sdir / "10-bad.sh").exists() and not (sdir / "10-bad.sh.json").exists()


def test_syntax_error_does_not_replace_an_installed_script(localhost, sdir):
    assert startup_script(localhost, name="s", content=GOOD, scripts_dir=str(sdir)).is_successful
    res = startup_script(localhost, name="s", content="#!/bin/bash\necho 'unterminated\n", scripts_dir=str(sdir))
    assert res.is_failed and "syntax check (bash -n) failed" in res["msg"]
    assert (sdir / "s").read_text() == GOOD


def test_missing_shebang_is_refused(localhost, sdir):
    res = startup_script(localhost, name="noshebang", content="echo hi\n", scripts_dir=str(sdir))
    assert res.is_failed
    assert "must start with a shebang line" in res["msg"] and "'echo hi'" in res["msg"]


def test_python_script_is_compiled(localhost, sdir):
    res = startup_script(localhost, name="p.py", content="#!/usr/bin/env python3\ndef f(:\n    pass\n",
                         scripts_dir=str(sdir))
    assert res.is_failed and "syntax check (Python compile) failed" in res["msg"]
    ok = startup_script(localhost, name="p.py", content="#!/usr/bin/env python3\nprint('ok')\n",
                        scripts_dir=str(sdir))
    assert ok.is_successful and ok["interpreter"] == "python3"


def test_missing_absolute_interpreter_is_refused(localhost, sdir):
    res = startup_script(localhost, name="x", content="#!/nonexistent/bash\ntrue\n", scripts_dir=str(sdir))
    assert res.is_failed and "interpreter /nonexistent/bash" in res["msg"]


def test_src_on_the_node(localhost, sdir, tmp_path):
    src = tmp_path / "site.sh"
    src.write_text(GOOD)
    res = startup_script(localhost, name="site.sh", src=str(src), scripts_dir=str(sdir))
    assert res.is_successful and res["changed"] is True
    assert (sdir / "site.sh").read_text() == GOOD
    res = startup_script(localhost, name="gone.sh", src=str(tmp_path / "nope.sh"), scripts_dir=str(sdir))
    assert res.is_failed and "does not exist" in res["msg"]


def test_absent_removes_both_files(localhost, sdir):
    startup_script(localhost, name="old", content=GOOD, scripts_dir=str(sdir))
    res = startup_script(localhost, name="old", state="absent", scripts_dir=str(sdir))
    assert res["changed"] is True and os.listdir(sdir) == []
    assert startup_script(localhost, name="old", state="absent", scripts_dir=str(sdir))["changed"] is False


def test_bad_input_names_the_field(localhost, sdir):
    res = startup_script(localhost, name="../escape", content=GOOD, scripts_dir=str(sdir))
    assert res.is_failed and "name: expected" in res["msg"]
    res = startup_script(localhost, name="t", content=GOOD, timeout=0, scripts_dir=str(sdir))
    assert res.is_failed and "timeout: expected an integer from 1" in res["msg"]
    res = startup_script(localhost, name="t", content=GOOD, environment={"BAD-NAME": "x"}, scripts_dir=str(sdir))
    assert res.is_failed and "environment" in res["msg"] and "BAD-NAME" in res["msg"]
    res = startup_script(localhost, name="t", scripts_dir=str(sdir))
    assert res.is_failed and "content" in res["msg"] and "src" in res["msg"]


def _play(tmp_path, monkeypatch, tasks, cmdline=""):
    pdd = tmp_path / "runner"
    (pdd / "project").mkdir(parents=True, exist_ok=True)
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    (pdd / "project" / "play.yml").write_text(yaml.safe_dump(play))
    # ansible-runner execs ansible-playbook from PATH
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="play.yml", quiet=True, cmdline=cmdline,
        inventory={"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                   "ansible_python_interpreter": sys.executable}}}},
        envvars={"ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections")},
    )
    results = [e["event_data"]["res"] for e in r.events if e["event"] in ("runner_on_ok", "runner_on_failed")]
    return r, results


def test_check_and_diff_mode(tmp_path, sdir, localhost, monkeypatch):
    task = {"name": "script", MODULE: {"name": "c.sh", "content": GOOD, "scripts_dir": str(sdir)}}
    r, results = _play(tmp_path, monkeypatch, [task], cmdline="--check --diff")
    assert r.status == "successful", results
    assert results[0]["changed"] is True and not sdir.exists()
    diffs = results[0]["diff"]
    assert [d["after_header"] for d in diffs] == [str(sdir / "c.sh"), str(sdir / "c.sh.json")]
    assert diffs[0]["before"] == "" and diffs[0]["after"] == GOOD
    startup_script(localhost, name="c.sh", content=GOOD, scripts_dir=str(sdir))
    new = GOOD.replace("ready", "set")
    task[MODULE]["content"] = new
    r, results = _play(tmp_path, monkeypatch, [task], cmdline="--check --diff")
    assert results[0]["changed"] is True and len(results[0]["diff"]) == 1
    assert results[0]["diff"][0]["before"] == GOOD and results[0]["diff"][0]["after"] == new
    assert (sdir / "c.sh").read_text() == GOOD  # check mode wrote nothing
    task[MODULE]["state"] = "absent"
    r, results = _play(tmp_path, monkeypatch, [task], cmdline="--check")
    assert results[0]["changed"] is True and (sdir / "c.sh").exists()
