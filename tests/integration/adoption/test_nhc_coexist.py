# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A site that already runs LBNL NHC adopts the collection (installed from its tarball) in the real Slurm lab.

The real NHC 1.4.3 (tests/thirdparty/nhc) is installed into a private prefix and made the lab's
HealthCheckProgram, with a check that fails on one node. Then, as a site would: `--check --diff`, the
slurm_reliability role for real, and again (nothing changes). Afterwards NHC and the gpufleet agent both still
drain (each with its own reason), and the repair playbook repairs the agent's node and leaves NHC's node alone.

Without the lab, on copies of a site's slurm.conf: refuse and replace, PrologFlags kept, and include mode (a
slurm.conf templated by another tool is only read; the profile goes to a file of our own).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tarfile
from pathlib import Path

import ansible_runner
import pytest
import yaml

from support.repair_lab import RepairLab, wait_until

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
NHC_TARBALL = REPO / "tests" / "thirdparty" / "nhc" / "nhc-1.4.3.tar.gz"


def install_nhc(base: Path, lab, failing_node: str) -> Path:
    """NHC unpacked from its release tarball into ``base`` (nothing outside it); returns the HealthCheckProgram.

    slurmd starts the HealthCheckProgram without arguments, so, as sites do, a two-line script gives NHC its
    private paths (NHC takes VAR=value arguments). HOSTNAME is the Slurm node name: the lab runs every node on
    one host.
    """
    src = base / "src"
    with tarfile.open(NHC_TARBALL) as tf:
        tf.extractall(src, filter="data")
    top = src / "nhc-1.4.3"
    prefix = base / "nhc"
    for sub in ("sbin", "etc/nhc/scripts", "libexec/nhc", "log", "run"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(top / "nhc", prefix / "sbin" / "nhc")
    for script in (top / "scripts").glob("*.nhc"):
        shutil.copy(script, prefix / "etc" / "nhc" / "scripts" / script.name)
    for helper in ("node-mark-offline", "node-mark-online"):
        shutil.copy(top / "helpers" / helper, prefix / "libexec" / "nhc" / helper)
    (prefix / "etc" / "nhc" / "nhc.conf").write_text(
        "# private NHC configuration of the test: one node fails a file check, every node passes the rest\n"
        f"{failing_node} || check_file_test -e {base}/no-such-file-on-{failing_node}\n"
        f"* || check_file_test -d {base}\n")
    program = prefix / "sbin" / "nhc-slurm"
    program.write_text(
        "#!/bin/bash\n"
        f"export SLURM_CONF={lab.conf}\n"
        f"exec {prefix}/sbin/nhc CONFDIR={prefix}/etc/nhc HELPERDIR={prefix}/libexec/nhc "
        f"LOGFILE={prefix}/log/nhc.log RESULTFILE={prefix}/run/nhc.status TIMEOUT=20 "
        'HOSTNAME="$SLURMD_NODENAME" HOSTNAME_S="$SLURMD_NODENAME"\n')
    for p in [program, prefix / "sbin" / "nhc", *(prefix / "libexec" / "nhc").iterdir()]:
        p.chmod(0o755)
    return program


def set_conf_line(conf: Path, key: str, value: str) -> None:
    text = conf.read_text()
    new, n = re.subn(rf"(?m)^{key}=.*$", f"{key}={value}", text)
    assert n == 1, f"{key} not found once in {conf}"
    conf.write_text(new)


def show_config(lab, key: str):
    for line in lab.run("scontrol", "show", "config").stdout.splitlines():
        m = re.match(rf"^{key}(\[0\])?\s+= (.*)$", line)
        if m:
            return m.group(2).strip()
    return None


def show_config_all(lab, key: str) -> list:
    """Every value of a key (24.11 prints a key that may repeat as Key[0], Key[1], ...)."""
    out = []
    for line in lab.run("scontrol", "show", "config").stdout.splitlines():
        m = re.match(rf"^{key}(\[\d+\])?\s+= (.*)$", line)
        if m:
            out.append(m.group(2).strip())
    return out


def wait_config(lab, key: str, want: str, timeout: float = 30):
    wait_until(lambda: show_config(lab, key) == want, timeout=timeout, what=f"{key} = {want}")


class InstalledRepairLab(RepairLab):
    """RepairLab whose repair.yml is the installed collection's (by FQCN, from the site's project)."""

    def __init__(self, lab, tmp: Path, installed):
        super().__init__(lab, tmp)
        self.installed = installed

    def _envvars(self):
        env = super()._envvars()
        env.update(self.installed.ansible_env)
        return env

    def run(self, ok=True, cmdline=None, **kw):
        """As RepairLab.run (``ok``: True must succeed, False must fail, None either)."""
        pdd = self._private()
        (pdd / "project").mkdir()
        (pdd / "project" / "repair.yml").write_text(yaml.safe_dump(
            [{"name": "repair", "ansible.builtin.import_playbook": "gpufleet.reliability.repair"}]))
        r = ansible_runner.run(private_data_dir=str(pdd), playbook="repair.yml", extravars=self.extravars(**kw),
                               envvars=self._envvars(), quiet=True, timeout=600, cmdline=cmdline)
        artifacts = {}
        for event in r.events:
            if event.get("event") == "playbook_on_stats":
                artifacts = event.get("event_data", {}).get("artifact_data") or {}
        r.output = r.stdout.read() if hasattr(r.stdout, "read") else ""
        if ok is not None:
            assert (r.rc == 0) == ok, f"repair.yml rc={r.rc}, expected {'success' if ok else 'failure'}\n" \
                                      f"{r.output[-6000:]}"
        return r, artifacts


def harden(installed, tmp: Path, extravars: dict, cmdline: str = "", play=None):
    """harden_slurm.yml of the installed collection (or the site's own ``play``), run from the site's project;
    returns (runner, tasks)."""
    n = len(list(tmp.glob("harden-*")))
    pdd = tmp / f"harden-{n}"
    (pdd / "project").mkdir(parents=True)
    default = [{"name": "harden", "ansible.builtin.import_playbook": "gpufleet.reliability.harden_slurm"}]
    (pdd / "project" / "play.yml").write_text(yaml.safe_dump(play or default))
    env = dict(installed.ansible_env)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="play.yml", quiet=True, cmdline=cmdline, envvars=env,
        inventory={"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                   "ansible_python_interpreter": sys.executable}}}},
        extravars={"gpufleet_slurm_hosts": "localhost", "gpufleet_slurm_become": False, **extravars})
    tasks = {}
    for event in r.events:
        if event["event"] in ("runner_on_ok", "runner_on_failed", "runner_on_skipped"):
            data = event["event_data"]
            res = dict(data.get("res") or {})
            res["_event"] = event["event"]
            tasks.setdefault(data["task"], []).append(res)
    return r, tasks


def changed(r) -> int:
    return sum((r.stats or {}).get("changed", {}).values())


@pytest.mark.lab
def test_nhc_and_the_agent_both_drain_and_repair_leaves_nhc_alone(lab, tmp_path, installed_collection, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    n_nhc, n_gpu = lab.nodes[1], lab.nodes[2]
    others = [n for n in lab.nodes if n not in (n_nhc, n_gpu)]
    original = lab.conf.read_bytes()
    work = lab.dir / "nhc-coexist"  # inside the lab dir: the daemons see it in both lanes
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    rl = InstalledRepairLab(lab, tmp_path / "repair", installed_collection)
    try:
        # --- the site as it was: NHC is the HealthCheckProgram, and it drains the node whose check fails
        nhc = install_nhc(work, lab, n_nhc)
        # Slurm 24.11 keeps a node's last reason after RESUME, and NHC keeps ("preserves") a note it did not set,
        # even on an idle node: a reason left by an earlier test (slurm_stuck's "Kill task failed") would become
        # NHC's. "none" is what sinfo prints for no reason, and NHC reads it so.
        if lab.run("sinfo", "-h", "-n", n_nhc, "-o", "%E").stdout.strip() not in ("", "none"):
            lab.run("scontrol", "update", f"NodeName={n_nhc}", "Reason=none")
        set_conf_line(lab.conf, "HealthCheckProgram", str(nhc))
        site_conf = lab.conf.read_bytes()
        lab.run("scontrol", "reconfigure")
        wait_config(lab, "HealthCheckProgram", str(nhc))
        state, reason = lab.wait_for(n_nhc, lambda sr: sr[0] in ("drained", "draining")
                                     and sr[1].startswith("NHC:"), timeout=60)
        assert f"no-such-file-on-{n_nhc}" in reason, reason
        rl.install()  # the gpufleet agent (real, on replayed GPUs) is what the lab's own health check runs

        # --- the role, as a site runs it: --check --diff first (nothing written), then for real, then again
        ours = str(lab.dir / "bin" / "healthcheck")
        extravars = {
            "slurm_reliability_slurm_conf": str(lab.conf),
            "slurm_reliability_gres_conf": str(work / "gres.conf"),
            "slurm_reliability_cgroup_conf": str(work / "cgroup.conf"),
            "slurm_reliability_script_dir": str(work / "libexec"),
            "slurm_reliability_epilog_dir": str(work / "epilog.d"),
            "slurm_reliability_unkillable_step_log": str(work / "unkillable.log"),
            "slurm_reliability_reboot_program": str(lab.dir / "bin" / "fake-reboot"),
            "slurm_reliability_healthcheck_interval": 5,
            "slurm_reliability_slurmd_timeout": 30,
            "slurm_reliability_resume_timeout": 60,
            "slurm_reliability_manage_gres": False,
            "slurm_reliability_backup": False,
            "gpufleet_slurm_healthcheck_program": ours,
        }
        chain = work / "libexec" / "gpufleet-healthcheck-chain"
        r, tasks = harden(installed_collection, tmp_path, extravars, cmdline="--check --diff")
        assert r.status == "successful", tasks
        diff = tasks["Apply the reliability profile to slurm.conf (or to the file slurm.conf includes)"][0]["diff"]
        assert f"\nHealthCheckProgram={nhc}\n" in diff["before"], diff
        assert f"\nHealthCheckProgram={chain}\n" in diff["after"], diff
        assert lab.conf.read_bytes() == site_conf and not chain.exists()

        r, tasks = harden(installed_collection, tmp_path, extravars)
        assert r.status == "successful", tasks
        assert f"# gpufleet-chained-program: {nhc}\n" in chain.read_text()
        site_epilog = work / "epilog.d" / "00-site-epilog"
        assert site_epilog.is_symlink() and os.readlink(site_epilog) == str(lab.dir / "bin" / "epilog")
        wait_config(lab, "HealthCheckProgram", str(chain))
        assert show_config(lab, "Epilog") == f"{work}/epilog.d/*"
        r2, tasks2 = harden(installed_collection, tmp_path, extravars)
        assert r2.status == "successful" and changed(r2) == 0, tasks2

        # --- after the role: NHC still drains (its node resumed by hand comes back drained, by NHC) ...
        lab.run("scontrol", "update", f"NodeName={n_nhc}", "State=RESUME")
        calls_before = (work / "nhc" / "log" / "nhc.log").read_text().count("Health check failed")
        wait_until(lambda: (work / "nhc" / "log" / "nhc.log").read_text().count("Health check failed") > calls_before,
                   timeout=60, what="NHC running again through the chain")
        state, reason = lab.wait_for(n_nhc, lambda sr: sr[0] in ("drained", "draining")
                                     and sr[1].startswith("NHC:"), timeout=60)
        # ... and so does the gpufleet agent, with its own reason, on another node
        rl.inject(n_gpu, "xid48", "reset_gpu")
        state, reason = rl.drained_by_agent(n_gpu, timeout=90)
        assert reason.startswith("gpufleet: xid48"), reason
        # NHC passes on the agent's node and, seeing a drain that is not its own, leaves it alone
        log = work / "nhc" / "log" / "nhc.log"
        wait_until(lambda: f"Not onlining {n_gpu}:  Down for non-NHC reason (gpufleet:" in log.read_text(),
                   timeout=60, what="NHC leaving the agent's drain alone")
        assert lab.node_states()[n_gpu][1].startswith("gpufleet:")
        assert lab.node_states()[n_nhc][1].startswith("NHC:")
        for n in others:
            assert lab.node_states()[n][0] == "idle", lab.node_states()

        # --- the repair playbook repairs the agent's node and never touches NHC's
        runs = rl.until(lambda: lab.node_states()[n_gpu][0] == "idle", runs=5)
        _r, art = rl.run(ok=True)  # a run that only finds NHC's node has nothing to do, and succeeds
        runs.append(art)
        for art in runs:
            held = {d["node"]: d for d in art["gpufleet_repair_plan"]["decisions"]}.get(n_nhc)
            assert held is None or (held["action"], held["rule"]) == ("hold", "not_ours"), held
        assert [ln for ln in rl.resets() if f" {n_gpu} " in ln], rl.resets()
        assert not [ln for ln in rl.resets() + rl.reboots() if n_nhc in ln], (rl.resets(), rl.reboots())
        state, reason = lab.node_states()[n_nhc]
        assert state in ("drained", "draining") and reason.startswith("NHC:"), (state, reason)
        assert rl.history(n_nhc) == {}
    finally:
        rl.uninstall()
        for p in (lab.dir / "faults").glob("*"):
            p.unlink()
        lab.run("scontrol", "update", f"NodeName={','.join(lab.nodes)}", "Extra=", check=False)
        lab.conf.write_bytes(original)
        lab.run("scontrol", "reconfigure", check=False)
        wait_config(lab, "HealthCheckProgram", str(lab.dir / "bin" / "healthcheck"))
        shutil.rmtree(work, ignore_errors=True)
        lab.reset()


# ------------------------------------------------------------------ without the lab: a site's slurm.conf copy
SITE_CONF = """\
# written by the site's configuration tool
ClusterName=site
HealthCheckProgram=/usr/sbin/nhc
HealthCheckInterval=300
Epilog=/etc/slurm/epilog.sh
PrologFlags=Contain,X11
NodeName=n[1-2] CPUs=4 State=UNKNOWN
"""


def copy_vars(base: Path) -> dict:
    return {
        "slurm_reliability_slurm_conf": str(base / "slurm.conf"),
        "slurm_reliability_gres_conf": str(base / "gres.conf"),
        "slurm_reliability_cgroup_conf": str(base / "cgroup.conf"),
        "slurm_reliability_script_dir": str(base / "libexec"),
        "slurm_reliability_epilog_dir": str(base / "epilog.d"),
        "slurm_reliability_reconfigure": False,
        "slurm_reliability_slurm_version": "22.05.8",
        "slurm_reliability_backup": False,
        "gpufleet_slurm_healthcheck_program": "/usr/local/sbin/gpufleet-healthcheck",
    }


def tree(base: Path) -> dict:
    return {str(p.relative_to(base)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
            for p in sorted(base.rglob("*"))}


def failed_msg(tasks) -> str:
    return " ".join(str(res.get("msg")) for results in tasks.values() for res in results
                    if res["_event"] == "runner_on_failed")


def test_refuse_names_the_settings_and_changes_nothing(tmp_path, installed_collection):
    base = tmp_path / "etc"
    base.mkdir()
    (base / "slurm.conf").write_text(SITE_CONF)
    r, tasks = harden(installed_collection, tmp_path,
                      {**copy_vars(base), "slurm_reliability_existing_programs": "refuse"})
    assert r.status == "failed"
    msg = failed_msg(tasks)
    assert "HealthCheckProgram=/usr/sbin/nhc and Epilog=/etc/slurm/epilog.sh" in msg, msg
    assert "slurm_reliability_existing_programs" in msg and "nothing was changed" in msg
    assert tree(base) == {"slurm.conf": SITE_CONF.encode()}


def test_refuse_in_a_play_with_other_roles_comes_before_any_of_them(tmp_path, installed_collection):
    """Issue 26: refuse stopped in slurm_reliability, after gpu_health (earlier in the same play) had installed its
    agent. The preflight entry point in pre_tasks refuses before any role runs; without it, the control, the agent's
    code is on the node when the refusal comes."""
    base = tmp_path / "etc"
    base.mkdir()
    (base / "slurm.conf").write_text(SITE_CONF)
    node = tmp_path / "node"  # where gpu_health installs, in this test
    health = {"gpu_health_lib_dir": str(node / "lib"), "gpu_health_venv": str(node / "venv"),
              "gpu_health_install_nvml": False, "gpu_health_agent_path": str(node / "bin" / "gpufleet-health"),
              "gpu_health_healthcheck_path": str(node / "sbin" / "gpufleet-healthcheck"),
              "gpu_health_config_dir": str(node / "etc"), "gpu_health_state_dir": str(node / "state"),
              "gpu_health_textfile_dir": "", "gpu_health_systemd_dir": str(node / "systemd")}

    def site_play(preflight):
        pre = [{"name": "Check the site's slurm.conf before any role changes the node",
                "ansible.builtin.include_role": {"name": "gpufleet.reliability.slurm_reliability",
                                                 "tasks_from": "preflight"}}]
        return [{"name": "A GPU node, as a site writes it", "hosts": "localhost", "gather_facts": False,
                 "pre_tasks": pre if preflight else [],
                 "roles": ["gpufleet.reliability.gpu_health", "gpufleet.reliability.slurm_reliability"]}]

    settings = {**copy_vars(base), **health, "slurm_reliability_existing_programs": "refuse"}
    r, tasks = harden(installed_collection, tmp_path, settings, play=site_play(False))
    assert r.status == "failed" and node.exists() and any(node.rglob("*.py")), tasks  # the control: installed
    shutil.rmtree(node)
    r, tasks = harden(installed_collection, tmp_path, settings, play=site_play(True))
    assert r.status == "failed"
    assert "slurm_reliability_existing_programs" in failed_msg(tasks) and not node.exists(), tasks
    assert tree(base) == {"slurm.conf": SITE_CONF.encode()}


def test_chain_keeps_prolog_flags_and_replace_says_what_it_drops(tmp_path, installed_collection):
    base = tmp_path / "etc"
    base.mkdir()
    (base / "slurm.conf").write_text(SITE_CONF)
    r, tasks = harden(installed_collection, tmp_path, copy_vars(base))
    assert r.status == "successful", tasks
    conf = (base / "slurm.conf").read_text()
    assert f"HealthCheckProgram={base}/libexec/gpufleet-healthcheck-chain\n" in conf
    assert "PrologFlags=Contain,X11,Alloc,DeferBatch\n" in conf and f"Epilog={base}/epilog.d/*\n" in conf
    chain = (base / "libexec" / "gpufleet-healthcheck-chain").read_text()
    assert "site=/usr/sbin/nhc\nours=/usr/local/sbin/gpufleet-healthcheck\n" in chain
    assert os.readlink(base / "epilog.d" / "00-site-epilog.sh") == "/etc/slurm/epilog.sh"
    r, tasks = harden(installed_collection, tmp_path, copy_vars(base))
    assert r.status == "successful" and changed(r) == 0, tasks

    (base / "slurm.conf").write_text(SITE_CONF)
    r, tasks = harden(installed_collection, tmp_path,
                      {**copy_vars(base), "slurm_reliability_existing_programs": "replace"})
    assert r.status == "successful", tasks
    said = tasks["Say what is replaced (slurm_reliability_existing_programs=replace)"][0]["msg"]
    assert "HealthCheckProgram=/usr/sbin/nhc and Epilog=/etc/slurm/epilog.sh" in said and "no longer run" in said
    assert "HealthCheckProgram=/usr/local/sbin/gpufleet-healthcheck\n" in (base / "slurm.conf").read_text()


def test_include_mode_only_reads_a_templated_slurm_conf(tmp_path, installed_collection):
    base = tmp_path / "etc"
    base.mkdir()
    ours = base / "gpufleet-reliability.conf"
    extravars = {**copy_vars(base), "slurm_reliability_config_mode": "include",
                 "slurm_reliability_include_file": str(ours)}
    (base / "slurm.conf").write_text(SITE_CONF)  # the template has no Include line yet
    r, tasks = harden(installed_collection, tmp_path, extravars)
    assert r.status == "failed" and f'has no line "Include {ours}"' in failed_msg(tasks), failed_msg(tasks)
    assert tree(base) == {"slurm.conf": SITE_CONF.encode()}
    late = SITE_CONF + f"Include {ours}\nHealthCheckInterval=60\n"  # a key after the Include overrides ours
    (base / "slurm.conf").write_text(late)
    r, tasks = harden(installed_collection, tmp_path, extravars)
    assert r.status == "failed" and f'sets HealthCheckInterval after "Include {ours}"' in failed_msg(tasks)
    assert not ours.exists()

    templated = SITE_CONF + f"Include {ours}\n"
    (base / "slurm.conf").write_text(templated)
    for _run_number in range(2):
        r, tasks = harden(installed_collection, tmp_path, extravars)
        assert r.status == "successful", tasks
        assert (base / "slurm.conf").read_text() == templated
    assert changed(r) == 0, tasks
    text = ours.read_text()
    assert f"HealthCheckProgram={base}/libexec/gpufleet-healthcheck-chain\n" in text
    # the site's HealthCheckInterval is its own (before the Include line): our file does not override it
    assert "HealthCheckInterval" not in text and "PrologFlags=Contain,X11,Alloc,DeferBatch\n" in text
    assert "ClusterName" not in text and "NodeName" not in text


@pytest.mark.lab
def test_include_mode_in_the_lab_slurmctld_takes_our_file(lab, tmp_path, installed_collection):
    """A templated slurm.conf that ends with the Include line: the role writes only its own file, and after the
    reconfigure slurmctld runs with the profile's values (the later value of a key wins), the nodes still work."""
    original = lab.conf.read_bytes()
    work = lab.dir / "include-mode"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    ours = work / "gpufleet-reliability.conf"
    templated = original + f"Include {ours}\n".encode()
    extravars = {
        "slurm_reliability_config_mode": "include",
        "slurm_reliability_include_file": str(ours),
        "slurm_reliability_slurm_conf": str(lab.conf),
        "slurm_reliability_cgroup_conf": str(work / "cgroup.conf"),
        "slurm_reliability_script_dir": str(work / "libexec"),
        "slurm_reliability_epilog_dir": str(work / "epilog.d"),
        "slurm_reliability_unkillable_step_log": str(work / "unkillable.log"),
        "slurm_reliability_reboot_program": str(lab.dir / "bin" / "fake-reboot"),
        "slurm_reliability_healthcheck_interval": 7,  # the lab's slurm.conf says 5 (not 7), before the Include
        "slurm_reliability_slurmd_timeout": 30,
        "slurm_reliability_resume_timeout": 60,
        "slurm_reliability_manage_gres": False,
        "slurm_reliability_backup": False,
        "gpufleet_slurm_healthcheck_program": str(lab.dir / "bin" / "healthcheck"),
    }
    assert not re.search(rb"(?m)^HealthCheckInterval=7$", original)
    try:
        lab.conf.write_bytes(templated)
        r, tasks = harden(installed_collection, tmp_path, extravars)
        assert r.status == "successful", tasks
        assert lab.conf.read_bytes() == templated  # slurm.conf only read
        assert "HealthCheckInterval=7\n" in ours.read_text()
        wait_until(lambda: (show_config(lab, "HealthCheckInterval") or "").startswith("7 "), timeout=30,
                   what="HealthCheckInterval from the included file")
        assert show_config(lab, "UnkillableStepTimeout") == "180 sec"
        site_epilog = str(lab.dir / "bin" / "epilog")
        link = work / "epilog.d" / "00-site-epilog"
        if lab.release == "22.05":  # the included Epilog replaces the site's: the site's is linked into our glob
            assert show_config_all(lab, "Epilog") == [f"{work}/epilog.d/*"]
            assert os.readlink(link) == site_epilog
        else:  # 24.11: every Epilog line runs; ours is one more and nothing is linked (it would run twice)
            assert show_config_all(lab, "Epilog") == [site_epilog, f"{work}/epilog.d/*"]
            assert not link.exists() and not link.is_symlink()
        lab.wait_all(("idle",), timeout=60)
        n = len(lab.nodes)
        out = lab.run("srun", "-N", str(n), "-n", str(n), "hostname", timeout=90)
        assert len(out.stdout.split()) == n
        lab.wait_all(("idle",), timeout=60)  # the epilogs (the lab's, linked, and the hook) ran without a drain
        r, tasks = harden(installed_collection, tmp_path, extravars)
        assert r.status == "successful" and changed(r) == 0, tasks
    finally:
        lab.conf.write_bytes(original)
        lab.run("scontrol", "reconfigure", check=False)
        before = re.search(rb"(?m)^HealthCheckInterval=(\d+)", original)
        if before:
            wait_until(lambda: (show_config(lab, "HealthCheckInterval") or "").startswith(f"{int(before[1])} "),
                       timeout=30, what="the lab's HealthCheckInterval back")
        shutil.rmtree(work, ignore_errors=True)
