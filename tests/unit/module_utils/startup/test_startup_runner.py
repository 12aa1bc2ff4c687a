# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Tests of gpufleet-startup (plugins/module_utils/cli/startup.py, startup/runner.py) with real scripts and processes.
import json
import os
import signal
import socket
import struct
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import startup as startup_cli
from ansible_collections.gpufleet.reliability.plugins.module_utils.startup.scripts import (
    MetaError,
    discover,
    meta_from_dict,
)


def by_name(report):
    return {s["name"]: s for s in report["scripts"]}


def test_scripts_run_in_order_then_name(scripts, tmp_path):
    trail = tmp_path / "trail"
    for name, order in (("c", 30), ("a", 10), ("zz", 20), ("b", 20)):
        scripts.add(name, f'echo {name} >> "{trail}"', order=order)
    assert startup_cli.main(scripts.argv()) == 0
    assert trail.read_text().split() == ["a", "b", "zz", "c"]
    assert [s["name"] for s in scripts.report()["scripts"]] == ["a", "b", "zz", "c"]


def test_environment_and_output_tail_reach_the_report(scripts):
    scripts.add("env", 'echo "greeting=$GREETING phase=$GPUFLEET_STARTUP_PHASE"; echo to-stderr >&2; exit 0',
                environment={"GREETING": "hello"})
    assert startup_cli.main(scripts.argv("--phase", "every_boot")) == 0
    entry = by_name(scripts.report())["env"]
    assert entry["output_tail"] == ["greeting=hello phase=every_boot", "to-stderr"]
    log = (scripts.state / "startup.log").read_text()
    assert "env: start" in log and "env: end, exit 0" in log and "| greeting=hello" in log


def test_timeout_kills_the_whole_process_group(scripts, tmp_path, alive):
    pids = tmp_path / "pids"
    # The script ignores SIGTERM, starts a child and a grandchild that also ignore it, then hangs.
    scripts.add("hang", "\n".join([
        "trap '' TERM",
        f'sleep 300 & echo $! >> "{pids}"',
        f"bash -c 'trap \"\" TERM; sleep 300 & echo $! >> \"{pids}\"; echo $$ >> \"{pids}\"; wait' &",
        f'echo $$ >> "{pids}"',
        "echo started",
        "wait",
    ]), timeout=1)
    scripts.add("after", "true", order=90)
    code = startup_cli.main(scripts.argv("--kill-grace", "0.5"))
    assert code == 1
    report = scripts.report()
    hang = by_name(report)["hang"]
    assert hang["timed_out"] is True and hang["status"] == "failed"
    assert hang["exit_code"] == -signal.SIGKILL  # SIGTERM was ignored: escalated to SIGKILL
    assert "started" in hang["output_tail"]
    assert report["failed"] == "hang"
    assert by_name(report)["after"]["status"] == "not_run"
    recorded = [int(p) for p in pids.read_text().split()]
    assert len(recorded) == 4
    survivors = [p for p in recorded if alive(p)]
    assert survivors == [], f"processes of the timed-out script survived: {survivors}"


def test_retry_until_success(scripts, tmp_path):
    count = tmp_path / "count"
    scripts.add("flaky", f'n=$(cat "{count}" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "{count}"; '
                         '[ "$n" -ge 3 ] || { echo "try $n failed"; exit 7; }',
                retries=2, retry_delay=0)
    assert startup_cli.main(scripts.argv()) == 0
    entry = by_name(scripts.report())["flaky"]
    assert entry["status"] == "ok" and entry["attempts"] == 3 and entry["exit_code"] == 0
    assert count.read_text().strip() == "3"


def test_retries_exhausted_fail(scripts, tmp_path):
    count = tmp_path / "count"
    scripts.add("broken", f'echo x >> "{count}"; echo nope; exit 4', retries=1, retry_delay=0)
    assert startup_cli.main(scripts.argv()) == 1
    entry = by_name(scripts.report())["broken"]
    assert entry["status"] == "failed" and entry["attempts"] == 2 and entry["exit_code"] == 4
    assert entry["output_tail"] == ["nope"]
    assert len(count.read_text().split()) == 2


def test_once_runs_once_across_runs_boot_once_per_boot(scripts, tmp_path):
    for name, phase in (("first", "once"), ("perboot", "boot"), ("always", "every_boot")):
        scripts.add(name, 'echo run >> "%s"' % (tmp_path / name), phase=phase)
    for boot in ("boot-a", "boot-a", "boot-b"):
        assert startup_cli.main(scripts.argv("--boot-id", boot)) == 0
    counts = {n: len((tmp_path / n).read_text().split()) for n in ("first", "perboot", "always")}
    assert counts == {"first": 1, "perboot": 2, "always": 3}
    last = by_name(scripts.report())
    assert last["first"]["status"] == "skipped" and last["first"]["skip_reason"] == "already done"
    assert (scripts.state / "once" / "first").is_file()
    # the markers of old boots are pruned
    assert sorted(os.listdir(scripts.state / "boot")) == ["boot-b"]


def test_phase_runs_only_that_phase_and_marks_only_what_ran(scripts, tmp_path):
    for name, phase in (("first", "once"), ("perboot", "boot"), ("always", "every_boot")):
        scripts.add(name, 'echo run >> "%s"' % (tmp_path / name), phase=phase)
    assert startup_cli.main(scripts.argv("--phase", "boot", "--boot-id", "boot-a")) == 0
    assert [(tmp_path / n).exists() for n in ("first", "perboot", "always")] == [False, True, False]
    assert [s["name"] for s in scripts.report()["scripts"]] == ["perboot"]
    assert scripts.report()["phase"] == "boot"
    # the once script was left out, not done: a later run of its phase still runs it, exactly once
    assert not (scripts.state / "once" / "first").exists()
    assert startup_cli.main(scripts.argv("--phase", "once", "--boot-id", "boot-a")) == 0
    assert startup_cli.main(scripts.argv("--phase", "once", "--boot-id", "boot-a")) == 0
    assert (tmp_path / "first").read_text().split() == ["run"]
    assert not (tmp_path / "always").exists()


def test_failed_once_script_is_not_marked_done(scripts, tmp_path):
    flag = tmp_path / "ok-now"
    scripts.add("setup", f'[ -e "{flag}" ]', phase="once")
    assert startup_cli.main(scripts.argv()) == 1
    assert not (scripts.state / "once" / "setup").exists()
    flag.touch()
    assert startup_cli.main(scripts.argv()) == 0
    assert startup_cli.main(scripts.argv()) == 0
    assert by_name(scripts.report())["setup"]["status"] == "skipped"


def test_stop_at_first_failure(scripts, tmp_path):
    scripts.add("a", 'touch "%s"' % (tmp_path / "a"), order=1)
    scripts.add("b", "echo broke; exit 3", order=2)
    scripts.add("c", 'touch "%s"' % (tmp_path / "c"), order=3)
    assert startup_cli.main(scripts.argv()) == 1
    report = scripts.report()
    assert report["ok"] is False and report["failed"] == "b"
    assert [s["status"] for s in report["scripts"]] == ["ok", "failed", "not_run"]
    assert (tmp_path / "a").exists() and not (tmp_path / "c").exists()


def test_optional_failure_does_not_stop(scripts, tmp_path):
    scripts.add("a", "exit 5", order=1, optional=True)
    scripts.add("b", 'touch "%s"' % (tmp_path / "b"), order=2)
    assert startup_cli.main(scripts.argv()) == 0
    report = scripts.report()
    assert report["ok"] is True and report["failed"] is None
    assert by_name(report)["a"]["status"] == "failed" and by_name(report)["a"]["exit_code"] == 5
    assert (tmp_path / "b").exists()


def test_role_filter(scripts, tmp_path):
    scripts.add("w", 'touch "%s"' % (tmp_path / "w"), roles=["worker"])
    scripts.add("l", 'touch "%s"' % (tmp_path / "l"), roles=["login", "controller"])
    assert startup_cli.main(scripts.argv("--role", "login")) == 0
    assert (tmp_path / "l").exists() and not (tmp_path / "w").exists()
    assert by_name(scripts.report())["w"]["skip_reason"] == "not for role login"


def test_health_command_failure_fails_the_run(scripts, tmp_path):
    scripts.add("a", "true")
    assert startup_cli.main(scripts.argv("--health-cmd", "sh -c 'echo sick; exit 2'")) == 1
    report = scripts.report()
    assert report["failed"] == "health-check"
    assert report["health"]["exit_code"] == 2 and report["health"]["output_tail"] == ["sick"]
    assert startup_cli.main(scripts.argv("--health-cmd", "true")) == 0


def test_bad_metadata_fails_naming_the_field(scripts):
    scripts.add("a", "true", phase="sometimes")
    assert startup_cli.main(scripts.argv()) == 1
    report = scripts.report()
    assert report["failed"] == "metadata"
    assert "phase: expected one of boot, every_boot, once, got 'sometimes'" in report["errors"][0]


def test_metadata_validation_messages():
    with pytest.raises(MetaError, match="timeout: expected an integer from 1"):
        meta_from_dict({"name": "x", "timeout": 0})
    with pytest.raises(MetaError, match="roles: expected a non-empty list"):
        meta_from_dict({"name": "x", "roles": ["gpu"]})
    with pytest.raises(MetaError, match=r"unknown key\(s\) colour; expected some of name, version"):
        meta_from_dict({"name": "x", "colour": "red"})
    with pytest.raises(MetaError, match="name: expected"):
        meta_from_dict({"name": "../evil"})


def test_metadata_without_script_is_reported(tmp_path):
    (tmp_path / "ghost.json").write_text(json.dumps({"name": "ghost"}))
    metas, errors = discover(str(tmp_path))
    assert metas == [] and "script %s is missing" % (tmp_path / "ghost") in errors[0]


def test_journal_native_protocol(scripts, tmp_path):
    path = str(tmp_path / "journal.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        scripts.add("j", "printf 'line one\\nline two\\n'")
        assert startup_cli.main(scripts.argv("--journal", "on", "--journal-socket", path)) == 0
        entries = []
        sock.setblocking(False)
        while True:
            try:
                entries.append(_parse_journal(sock.recv(65536)))
            except BlockingIOError:
                break
    finally:
        sock.close()
    ends = [e for e in entries if e.get("GPUFLEET_EVENT") == "end"]
    assert len(ends) == 1
    assert ends[0]["SYSLOG_IDENTIFIER"] == "gpufleet-startup" and ends[0]["GPUFLEET_EXIT_CODE"] == "0"
    assert "j: end, exit 0" in ends[0]["MESSAGE"] and "  | line two" in ends[0]["MESSAGE"]


def _parse_journal(data):
    fields = {}
    while data:
        key, data = data.split(b"\n", 1)
        (size,) = struct.unpack("<Q", data[:8])
        fields[key.decode()] = data[8:8 + size].decode()
        data = data[8 + size + 1:]
    return fields


def test_console_script_json_to_stdout(scripts):
    scripts.add("a", "echo hello")
    exe = os.path.join(os.path.dirname(sys.executable), "gpufleet-startup")
    proc = subprocess.run([exe, "run", "--scripts-dir", str(scripts.path), "--state-dir", str(scripts.state),
                           "--json", "-"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["scripts"][0]["output_tail"] == ["hello"]


def test_a_second_concurrent_run_is_refused(scripts, tmp_path):
    import fcntl

    scripts.add("a", 'touch "%s"' % (tmp_path / "ran"))
    scripts.state.mkdir()
    with open(scripts.state / ".lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        assert startup_cli.main(scripts.argv()) == 3
    assert not (tmp_path / "ran").exists()
    assert startup_cli.main(scripts.argv()) == 0
    assert (tmp_path / "ran").exists()


def test_gate_lets_slurmd_start_only_after_a_good_run_this_boot(scripts, tmp_path, capsys):
    gate = ["gate", "--state-dir", str(scripts.state)]
    assert startup_cli.main(gate + ["--boot-id", "b1"]) == 1  # no report at all
    assert "no usable startup report" in capsys.readouterr().err
    flag = tmp_path / "fixed"
    scripts.add("check", f'[ -e "{flag}" ]')
    assert startup_cli.main(scripts.argv("--boot-id", "b1")) == 1
    assert json.loads((scripts.state / "last-run.json").read_text())["failed"] == "check"
    assert startup_cli.main(gate + ["--boot-id", "b1"]) == 1  # failed and no Slurm node drained
    assert "could not be drained" in capsys.readouterr().err
    flag.touch()
    assert startup_cli.main(scripts.argv("--boot-id", "b1")) == 0
    assert startup_cli.main(gate + ["--boot-id", "b1"]) == 0
    assert startup_cli.main(gate + ["--boot-id", "b2"]) == 1  # last report is from another boot
    assert "not this boot" in capsys.readouterr().err


def test_a_script_that_cannot_be_executed_fails_with_the_reason(scripts):
    script = scripts.add("noexec", "true")
    os.chmod(script, 0o644)
    assert startup_cli.main(scripts.argv()) == 1
    entry = by_name(scripts.report())["noexec"]
    assert entry["status"] == "failed" and entry["exit_code"] is None
    assert "cannot execute" in entry["error"] and "Permission denied" in entry["error"]
