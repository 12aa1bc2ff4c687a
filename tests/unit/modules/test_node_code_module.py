# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""node_code (action plugin and module) run for real through Ansible: the node-side code in one module run."""
import json
import os
import shutil
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
GALAXY_VERSION = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]


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
    assert on_disk == sorted(files + [res["record"]])  # the derived files and the record, no temporary file left
    record = json.loads((dest / res["record"]).read_text())
    assert record == {"version": GALAXY_VERSION, "tree_sha256": res["tree_sha256"], "entries": ENTRIES,
                      "files": len(files)}
    assert res["version"] == GALAXY_VERSION and res["previous"] is None

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


def play_node_code(tmp_path, name, src, dest, entries=None, cmdline="--diff"):
    """node_code as a playbook task (the action plugin reads ``src`` and its collection's version); its result."""
    pdd = tmp_path / f"runner-{name}"
    (pdd / "project").mkdir(parents=True)
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"gpufleet.reliability.node_code": {"entries": entries or ENTRIES, "src": str(src), "dest": str(dest)}}]}]
    (pdd / "project" / "site.yml").write_text(yaml.safe_dump(play))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    inventory = {"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}
    r = ansible_runner.run(private_data_dir=str(pdd), playbook="site.yml", quiet=True, cmdline=cmdline,
                           inventory=inventory, envvars=ansible_env(env={"PATH": path}))
    assert r.rc == 0, r.stdout.read()[-3000:]
    return next(e["event_data"]["res"] for e in r.events if e["event"] in ("runner_on_ok", "runner_on_changed"))


def test_diff_mode_shows_a_manifest_not_the_source(tmp_path):
    dest = tmp_path / "mu"
    res = play_node_code(tmp_path, "check", SRC, dest, cmdline="--check --diff")
    files = sorted(node_files(ENTRIES, SRC))
    diff = res["diff"]
    # a manifest, one line a file (mode, sha256, path), not the source: reviewable in a --check --diff of a site
    after = diff["after"].splitlines()
    assert after[0] == (f"# gpufleet node code {GALAXY_VERSION} (tree sha256 {res['tree_sha256'][:16]}): "
                        f"{len(files)} files (mode, sha256, path)")
    assert [ln.split()[-1] for ln in after[1:]] == files and all(ln.startswith("0644 ") for ln in after[1:])
    assert f"{dest}/ directory absent" in diff["before"]
    assert diff["before_header"] == f"{dest}: gpufleet node code: none recorded"
    assert diff["after_header"] == \
        f"{dest}: gpufleet node code {GALAXY_VERSION} (tree sha256 {res['tree_sha256'][:16]})"
    assert len(diff["after"]) < 120 * (len(files) + 1)
    assert not dest.exists()


def test_an_upgrade_reads_as_one_version_to_the_next_and_roles_sharing_dest_keep_their_own_record(tmp_path):
    # a copy of the collection's code under a galaxy.yml of our own, as an upgrade from 0.1.0 to 0.1.1 ships it
    coll = tmp_path / "coll"
    shutil.copytree(SRC, coll / "plugins" / "module_utils", ignore=shutil.ignore_patterns("__pycache__"))
    src = coll / "plugins" / "module_utils"
    dest = tmp_path / "node" / "mu"
    (coll / "galaxy.yml").write_text("namespace: gpufleet\nname: reliability\nversion: 0.1.0\n")
    first = play_node_code(tmp_path, "first", src, dest)
    assert first["changed"] and first["version"] == "0.1.0" and first["previous"] is None
    # a second role's entries in the same dest: a record of its own, so neither flips the other's
    other = play_node_code(tmp_path, "other", src, dest, entries=["cli/health_agent.py"])
    assert other["record"] != first["record"] and other["version"] == "0.1.0"
    assert play_node_code(tmp_path, "again", src, dest)["changed"] is False
    assert play_node_code(tmp_path, "other-again", src, dest, entries=["cli/health_agent.py"])["changed"] is False

    # the upgrade: one file changed and a new version
    (coll / "galaxy.yml").write_text("namespace: gpufleet\nname: reliability\nversion: 0.1.1\n")
    (src / "cli" / "startup.py").write_text((src / "cli" / "startup.py").read_text() + "# 0.1.1\n")
    up = play_node_code(tmp_path, "up", src, dest)
    assert up["changed"] and up["changed_files"] == ["cli/startup.py"], up
    assert up["previous"] == {"version": "0.1.0", "tree_sha256": first["tree_sha256"]}
    assert up["diff"]["before_header"] == f"{dest}: gpufleet node code 0.1.0 (tree sha256 {first['tree_sha256'][:16]})"
    assert up["diff"]["after_header"] == f"{dest}: gpufleet node code 0.1.1 (tree sha256 {up['tree_sha256'][:16]})"
    changed = [ln for ln in up["diff"]["after"].splitlines() if ln not in up["diff"]["before"].splitlines()]
    assert len(changed) == 2 and changed[1].endswith("  cli/startup.py"), changed  # the header and that file

    # a version change alone (the same code, re-released) is a change too, and says so
    (coll / "galaxy.yml").write_text("namespace: gpufleet\nname: reliability\nversion: 0.1.2\n")
    bump = play_node_code(tmp_path, "bump", src, dest)
    assert bump["changed"] and bump["changed_files"] == [] and bump["version"] == "0.1.2"
    assert bump["tree_sha256"] == up["tree_sha256"]


def test_a_hostile_record_is_replaced_never_followed_or_echoed(tmp_path):
    dest = tmp_path / "mu"
    ok, res = install(dest)
    assert ok
    record = dest / res["record"]
    target = tmp_path / "elsewhere.json"
    target.write_text('{"version": "9.9.9", "tree_sha256": "x"}')
    record.unlink()
    record.symlink_to(target)
    ok, res = install(dest)
    assert ok and res["changed"] and res["previous"] is None and res["changed_files"] == [], res
    assert not record.is_symlink() and json.loads(record.read_text())["tree_sha256"] == res["tree_sha256"]
    assert target.read_text() == '{"version": "9.9.9", "tree_sha256": "x"}'
    # terminal escapes in a planted record's version are not printed back
    record.write_text(json.dumps({"version": "1.0\x1b]52;c;ZWNobw==\x07", "tree_sha256": "0" * 64}))
    ok, res = install(dest)
    assert ok and res["previous"] == {"version": "1.0??52?c?ZWNobw???", "tree_sha256": "0" * 64}, res
    record.write_text("not json" * 20000)  # too large, not a record
    ok, res = install(dest)
    assert ok and res["changed"] and res["previous"] is None
    assert install(dest)[1]["changed"] is False
