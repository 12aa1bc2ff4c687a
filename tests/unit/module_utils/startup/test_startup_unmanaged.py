# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files dropped into the scripts directory without NAME.json are not run, and the run says so: a warning per file
in the log, their names in the report's "unmanaged" list, the count in the "run end" line."""
import os
import subprocess
import sys

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import startup as startup_cli


def test_scripts_without_metadata_are_warned_counted_and_not_run(scripts, tmp_path):
    trail = tmp_path / "trail"
    scripts.add("10-managed.sh", f'echo managed >> "{trail}"')
    for name in ("20-dropped.sh", "mounts.sh~", "evil\nrun end: ok"):
        (scripts.path / name).write_text(f'#!/bin/sh\necho {name!r} >> "{trail}"\n')
        os.chmod(scripts.path / name, 0o755)
    (scripts.path / ".10-managed.sh.tmp123").write_text("a writer's temp file\n")
    (scripts.path / "subdir").mkdir()
    log = tmp_path / "startup.log"
    assert startup_cli.main(scripts.argv("--log-file", str(log), "--journal", "off")) == 0
    assert trail.read_text() == "managed\n"
    report = scripts.report()
    assert report["ok"] is True
    assert report["unmanaged"] == sorted(["20-dropped.sh", "mounts.sh~", "evil\nrun end: ok"])
    text = log.read_text()
    assert "'20-dropped.sh': no metadata file" in text and "not run" in text
    # a hostile file name cannot forge a log line: it is quoted, its newline escaped
    assert "'evil\\nrun end: ok'" in text
    assert [line for line in text.splitlines() if "run end:" in line and "gpufleet-startup[" in line][-1].endswith(
        "run end: ok, 3 file(s) without metadata not run")


def test_clean_directory_has_an_empty_list(scripts):
    scripts.add("a", "true")
    assert startup_cli.main(scripts.argv()) == 0
    assert scripts.report()["unmanaged"] == []


def test_warning_reaches_stderr_of_the_command(scripts):
    (scripts.path / "orphan.sh").write_text("#!/bin/sh\ntrue\n")
    exe = os.path.join(os.path.dirname(sys.executable), "gpufleet-startup")
    proc = subprocess.run([exe, "run", "--scripts-dir", str(scripts.path), "--state-dir", str(scripts.state),
                           "--journal", "off", "--log-file", "", "--json", str(scripts.root / "report.json")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert scripts.report()["unmanaged"] == ["orphan.sh"]
    assert "'orphan.sh': no metadata file" in proc.stderr
