# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""node_code (action plugin and module) run for real through Ansible: the node-side code in one module run."""
import os
import stat
import sys
from pathlib import Path

import ansible_runner
import yaml

from ansible_collections.gpufleet.reliability.plugins.filter.node_files import node_files
from support.ansible_cli import ansible_env, run_module

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "plugins" / "module_utils"
ENTRIES = ["cli/startup.py"]


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def install(dest, check=False, **more):
    return run_module("node_code", {"entries": ENTRIES, "src": str(SRC), "dest": str(dest), **more}, check=check)


def test_installs_every_file_once_then_changes_nothing(tmp_path):
    dest = tmp_path / "lib" / "module_utils"
    files = node_files(ENTRIES, SRC)
    assert len(files) > 5 and "cli/startup.py" in files

    ok, res = install(dest, check=True)
    assert ok and res["changed"] is True and res["changed_files"] == sorted(files), res
    assert not (tmp_path / "lib").exists(), "check mode wrote to the node"

    ok, res = install(dest)
    assert ok and res["changed"] is True and res["files"] == sorted(files) and res["changed_files"] == sorted(files)
    assert "invocation" not in res  # the files' text is not echoed back
    for rel in files:
        assert (dest / rel).read_bytes() == (SRC / rel).read_bytes(), rel
        assert mode(dest / rel) == 0o644, rel
    assert mode(dest) == 0o755 and mode(dest / "startup") == 0o755
    on_disk = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert on_disk == sorted(files)  # exactly the derived files, no temporary file left

    ok, res = install(dest)
    assert ok and res["changed"] is False and res["changed_files"] == [] and res["created_directories"] == [], res


def test_only_what_drifted_is_written(tmp_path):
    dest = tmp_path / "mu"
    assert install(dest)[0]
    (dest / "cli/startup.py").write_text("# edited by hand\n")
    os.chmod(dest / "startup/__init__.py", 0o600)
    os.chmod(dest / "startup", 0o700)
    untouched = (dest / "fileutil.py").stat().st_mtime_ns
    (dest / "stray.py").write_text("left alone\n")

    ok, res = install(dest, check=True)
    assert ok and res["changed"] and res["changed_files"] == ["cli/startup.py", "startup/__init__.py"], res
    assert (dest / "cli/startup.py").read_text() == "# edited by hand\n"

    ok, res = install(dest)
    assert ok and res["changed_files"] == ["cli/startup.py", "startup/__init__.py"], res
    assert (dest / "cli/startup.py").read_bytes() == (SRC / "cli/startup.py").read_bytes()
    assert mode(dest / "startup/__init__.py") == 0o644 and mode(dest / "startup") == 0o755
    assert (dest / "fileutil.py").stat().st_mtime_ns == untouched
    assert (dest / "stray.py").read_text() == "left alone\n"


def test_a_link_planted_at_a_file_is_replaced_and_its_target_untouched(tmp_path):
    dest = tmp_path / "mu"
    assert install(dest)[0]
    target = tmp_path / "elsewhere.py"
    target.write_text("secret\n")
    (dest / "fileutil.py").unlink()
    (dest / "fileutil.py").symlink_to(target)
    ok, res = install(dest)
    assert ok and res["changed_files"] == ["fileutil.py"], res
    assert not (dest / "fileutil.py").is_symlink()
    assert (dest / "fileutil.py").read_bytes() == (SRC / "fileutil.py").read_bytes()
    assert target.read_text() == "secret\n"


def test_bad_input_names_the_field_and_writes_nothing(tmp_path):
    dest = tmp_path / "mu"
    ok, res = install(dest, mode="0999")
    assert not ok and res["msg"].startswith("mode: expected an octal mode"), res
    ok, res = install(dest, directory_mode="rwx")
    assert not ok and res["msg"].startswith("directory_mode: expected an octal mode"), res
    ok, res = run_module("node_code", {"entries": ["cli/nothing.py"], "src": str(SRC), "dest": str(dest)})
    assert not ok and res["msg"].startswith("entries: ") and "cli/nothing.py" in res["msg"], res
    ok, res = run_module("node_code", {"entries": ENTRIES, "src": str(SRC), "dest": str(dest),
                                       "files": {"../../etc/passwd": "x"}})
    assert not ok and "files" in res["msg"], res  # set only by the action plugin
    assert not dest.exists()
    # a directory where a file goes: refused before anything is written
    (dest / "cli/startup.py").mkdir(parents=True)
    ok, res = install(dest)
    assert not ok and res["msg"] == f"files: {dest}/cli/startup.py exists and is a directory", res
    assert sorted(p.name for p in dest.rglob("*")) == ["cli", "startup.py"]


def test_diff_mode_shows_a_manifest_not_the_source(tmp_path):
    dest = tmp_path / "mu"
    pdd = tmp_path / "runner"
    (pdd / "project").mkdir(parents=True)
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"gpufleet.reliability.node_code": {"entries": ENTRIES, "src": str(SRC), "dest": str(dest)}}]}]
    (pdd / "project" / "site.yml").write_text(yaml.safe_dump(play))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    inventory = {"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}
    r = ansible_runner.run(private_data_dir=str(pdd), playbook="site.yml", quiet=True, cmdline="--check --diff",
                           inventory=inventory, envvars=ansible_env(env={"PATH": path}))
    assert r.rc == 0, r.stdout.read()[-3000:]
    res = next(e["event_data"]["res"] for e in r.events if e["event"] == "runner_on_ok")
    files = sorted(node_files(ENTRIES, SRC))
    diff = res["diff"]
    # a manifest, one line a file (mode, sha256, path), not the source: reviewable in a --check --diff of a site
    after = diff["after"].splitlines()
    assert after[0].startswith(f"# gpufleet node code under {dest}: {len(files)} files")
    assert [ln.split()[-1] for ln in after[1:]] == files and all(ln.startswith("0644 ") for ln in after[1:])
    assert f"{dest}/ directory absent" in diff["before"] and res["tree_sha256"][:16] in diff["after_header"]
    assert len(diff["after"]) < 120 * (len(files) + 1)
    assert not dest.exists()
