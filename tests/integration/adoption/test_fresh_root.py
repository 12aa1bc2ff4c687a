# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every role that configures a host, from the collection installed out of its tarball, applied to a fresh root
(a temp directory standing for /): `--check --diff` first (no failure, nothing written), then for real, then again
(changed=0). node_repair is not here: it configures nothing on a host, it repairs a fleet through slurmctld (its
check mode runs in the repair lab tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import ansible_runner
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc.jwk import RSAKey

from support.oidc_forge import serve_json
from support.oidclab import SITE

NODE_PYTHON = "/usr/bin/python3"
SLURM_CONF = "ClusterName=site\nSlurmctldHost=head\n" \
             "NodeName=node[1-2] Gres=gpu:8 State=UNKNOWN\nPartitionName=gpu Nodes=node[1-2] Default=YES\n"
GRES_CONF = "AutoDetect=off\nName=gpu File=/dev/nvidia[0-7]\n"
pytestmark = pytest.mark.slow
ROLES = ["gpu_health", "startup_scripts", "slurm_reliability", "slurm_rest_jwt", "oidc_login"]


@pytest.fixture
def jwks_uri():
    """A real HTTP server on loopback serving a real public RSA JWKS (the IdP's keys endpoint)."""
    key = RSAKey.import_key(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    with serve_json({"keys": [key.as_dict(private=False) | {"kid": "k1", "use": "sig", "alg": "RS256"}]}) as url:
        yield url


def fresh_root(root: Path) -> None:
    """What a freshly installed Slurm GPU node has before the roles: Slurm's config files and sshd's."""
    (root / "etc/slurm").mkdir(parents=True)
    (root / "etc/slurm/slurm.conf").write_text(SLURM_CONF)
    (root / "etc/slurm/gres.conf").write_text(GRES_CONF)
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True)
    (root / "etc/pam.d").mkdir(parents=True)
    key = root / "etc/ssh/host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
    (root / "etc/ssh/sshd_config").write_text(f"Port 2222\nHostKey {key}\nPidFile {root}/run/sshd.pid\n"
                                              "PasswordAuthentication no\nPermitRootLogin no\n")
    (root / "etc/pam.d/sshd").write_text("@include common-auth\naccount required pam_unix.so\n"
                                         "session required pam_unix.so\n")


def all_role_vars(root: Path, jwks: str) -> dict:
    r = str(root)
    return {
        # gpu_health
        "gpu_health_lib_dir": f"{r}/opt/gpufleet/lib", "gpu_health_python": NODE_PYTHON,
        "gpu_health_venv": f"{r}/opt/gpufleet/venv", "gpu_health_agent_path": f"{r}/usr/local/bin/gpufleet-health",
        "gpu_health_healthcheck_path": f"{r}/usr/local/sbin/gpufleet-healthcheck",
        "gpu_health_config_dir": f"{r}/etc/gpufleet", "gpu_health_state_dir": f"{r}/var/lib/gpufleet/health",
        "gpu_health_textfile_dir": f"{r}/var/lib/prometheus/node-exporter",
        "gpu_health_systemd_dir": f"{r}/etc/systemd/system", "gpu_health_daemon_reload": False,
        "gpu_health_start_timer": False, "gpu_health_slurm_conf": f"{r}/etc/slurm/slurm.conf",
        "gpu_health_expected_gpus": 8,
        # startup_scripts
        "startup_scripts_lib_dir": f"{r}/opt/gpufleet/lib", "startup_scripts_python": NODE_PYTHON,
        "startup_scripts_bin_path": f"{r}/usr/local/sbin/gpufleet-startup",
        "startup_scripts_dir": f"{r}/etc/gpufleet/startup.d",
        "startup_scripts_state_dir": f"{r}/var/lib/gpufleet/startup",
        "startup_scripts_log_file": f"{r}/var/log/gpufleet/startup.log",
        "startup_scripts_systemd_dir": f"{r}/etc/systemd/system", "startup_scripts_daemon_reload": False,
        "startup_scripts_slurm_node": "node1", "startup_scripts_slurm_conf": f"{r}/etc/slurm/slurm.conf",
        "startup_scripts_scripts": [{"name": "10-mounts.sh", "order": 10, "roles": ["worker"],
                                     "content": "#!/usr/bin/env bash\necho mounts\n"}],
        # slurm_reliability (after gpu_health, which hands it the HealthCheckProgram)
        "slurm_reliability_slurm_conf": f"{r}/etc/slurm/slurm.conf",
        "slurm_reliability_gres_conf": f"{r}/etc/slurm/gres.conf",
        "slurm_reliability_cgroup_conf": f"{r}/etc/slurm/cgroup.conf",
        "slurm_reliability_script_dir": f"{r}/usr/local/libexec/gpufleet",
        "slurm_reliability_epilog_dir": f"{r}/etc/slurm/epilog.d",
        "slurm_reliability_unkillable_step_log": f"{r}/var/log/slurm/gpufleet-unkillable-step.log",
        "slurm_reliability_reconfigure": False, "slurm_reliability_slurm_version": "22.05.8",
        "slurm_reliability_include_file": f"{r}/etc/slurm/gpufleet-reliability.conf",
        # slurm_rest_jwt
        "slurm_rest_jwt_jwks_uri": jwks, "slurm_rest_jwt_jwks_path": f"{r}/etc/slurm/jwks.json",
        "slurm_rest_jwt_jwks_owner": "", "slurm_rest_jwt_jwks_group": "",
        "slurm_rest_jwt_slurm_conf": f"{r}/etc/slurm/slurm.conf", "slurm_rest_jwt_install_packages": False,
        "slurm_rest_jwt_create_restd_user": False, "slurm_rest_jwt_manage_services": False,
        "slurm_rest_jwt_systemd_dir": f"{r}/etc/systemd/system",
        "slurm_rest_jwt_refresh_script": f"{r}/usr/local/sbin/gpufleet-slurm-jwks-refresh",
        "slurm_rest_jwt_lib_dir": f"{r}/opt/gpufleet-oidc/lib", "slurm_rest_jwt_python": NODE_PYTHON,
        # oidc_login
        "oidc_login_config": {"issuer": "https://sso.example.org/realms/hpc", "audience": "gpufleet-ssh",
                              "client_id": "gpufleet-device", "username_claim": "preferred_username",
                              "groups_claim": "groups", "allowed_groups": ["hpc-users"],
                              "jwks_cache_dir": f"{r}/var/cache/gpufleet-oidc"},
        "oidc_login_install_packages": False, "oidc_login_manage_venv": False, "oidc_login_site_dir": str(SITE),
        "oidc_login_install_dir": f"{r}/opt/gpufleet-oidc", "oidc_login_config_path": f"{r}/etc/gpufleet/oidc.yml",
        "oidc_login_cli_path": f"{r}/usr/local/bin/gpufleet-oidc",
        "oidc_login_pam_dir": f"{r}/etc/pam.d", "oidc_login_sshd_config": f"{r}/etc/ssh/sshd_config",
        "oidc_login_sshd_dropin_dir": f"{r}/etc/ssh/sshd_config.d", "oidc_login_sshd_reload": False,
        "oidc_login_preflight": False,  # no IdP on a fresh root: the files and their idempotence are tested
    }


#: the most lines one host's `--check --diff` of every host role may print on a fresh root
DIFF_LINES_MAX = 1500


def tree(root: Path) -> dict:
    """Every path under root with its type, mode and content (or link target): what a run changed."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if p.is_symlink():
            out[str(p)] = ("link", os.readlink(p))
        elif p.is_dir():
            out[str(p)] = ("dir", st.st_mode & 0o7777)
        else:
            out[str(p)] = ("file", st.st_mode & 0o7777, p.read_bytes())
    return out


def apply(ic, tmp_path: Path, extravars: dict, cmdline: str = ""):
    pdd = Path(tempfile.mkdtemp(prefix="runner-", dir=tmp_path))  # its own: ansible-runner keeps env/cmdline
    (pdd / "project").mkdir()
    play = [{"name": "Every host role on a fresh root", "hosts": "node", "gather_facts": False,
             "roles": [f"gpufleet.reliability.{role}" for role in ROLES]}]
    (pdd / "project" / "site.yml").write_text(yaml.safe_dump(play))
    r = ansible_runner.run(
        private_data_dir=str(pdd), playbook="site.yml", quiet=True, extravars=extravars, cmdline=cmdline or None,
        inventory={"all": {"hosts": {"node": {"ansible_connection": "local", "ansible_host": "localhost",
                                              "ansible_python_interpreter": sys.executable}}}},
        envvars=ic.ansible_env,
    )
    failures = [(e["event_data"]["task"], e["event_data"].get("res")) for e in r.events
                if e["event"] == "runner_on_failed" and not e["event_data"].get("ignore_errors")]
    assert r.status == "successful" and r.rc == 0 and not failures, failures or r.stdout.read()[-6000:]
    changed = sorted({e["event_data"]["task"] for e in r.events
                      if e["event"] in ("runner_on_ok", "runner_item_on_ok") and e["event_data"]["res"].get("changed")})
    # every file a task wrote or would write is inside the fresh root (a role variable left at its default would
    # write to this host's real /etc or /usr/local)
    root = Path(extravars["gpu_health_lib_dir"]).parents[2]
    written = {(e["event_data"]["task"], str(e["event_data"]["res"].get(key)))
               for e in r.events if e["event"] in ("runner_on_ok", "runner_item_on_ok")
               and e["event_data"]["res"].get("changed") for key in ("dest", "path")
               if isinstance(e["event_data"]["res"].get(key), str)}
    assert not [w for w in written if not w[1].startswith(str(root) + "/")], written
    return r, changed


@pytest.mark.usefixtures("run_sshd_dir")
def test_every_role_check_then_apply_then_unchanged(installed_collection, tmp_path, jwks_uri, monkeypatch):
    assert os.access(NODE_PYTHON, os.X_OK), f"{NODE_PYTHON} is needed as the node's python"
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    root = tmp_path / "root"
    fresh_root(root)
    extravars = all_role_vars(root, jwks_uri)
    before = tree(root)

    r, predicted = apply(installed_collection, tmp_path, extravars, cmdline="--check --diff")
    assert tree(root) == before, "--check wrote to the host"
    # reviewable: the node code is a manifest line a file, never its source (about 14,000 lines when it was)
    review = r.stdout.read()
    print(f"--check --diff of one host, every host role: {review.count(chr(10))} lines")
    assert review.count("\n") < DIFF_LINES_MAX and "def main(" not in review, review.count("\n")
    for task in ("Enable the timer (what systemctl enable does, so it also works in another root)",
                 "Enable the startup unit (what systemctl enable does, so it also works in another root)",
                 "Install the health check service and timer", "Install the startup unit"):
        assert task in predicted, predicted

    r, done = apply(installed_collection, tmp_path, extravars)
    assert r.stats["changed"].get("node", 0) > 0
    # --check predicts what the real run does. One exception, and only it: slurm_rest_jwt's command directory
    # (usr/local/sbin), which gpu_health (whose check run created nothing) creates for real before it
    assert set(predicted) - set(done) <= {"Create the command directory"}, sorted(set(predicted) - set(done))
    systemd = root / "etc/systemd/system"
    assert (systemd / "timers.target.wants/gpufleet-health.timer").resolve() == systemd / "gpufleet-health.timer"
    assert (systemd / "multi-user.target.wants/gpufleet-startup.service").resolve() == \
        systemd / "gpufleet-startup.service"
    conf = (root / "etc/slurm/slurm.conf").read_text()
    assert "AuthAltTypes=auth/jwt" in conf
    assert json.loads((root / "etc/slurm/jwks.json").read_text())["keys"][0]["kid"] == "k1"
    assert "@include gpufleet-oidc" in (root / "etc/pam.d/sshd").read_text()
    # the node-side code came from the installed collection, not from this checkout
    lib = root / "opt/gpufleet/lib/ansible_collections/gpufleet/reliability/plugins/module_utils"
    assert (lib / "health/engine.py").read_bytes() == (
        installed_collection.path / "plugins/module_utils/health/engine.py").read_bytes()
    # and the node records which release it is (what a --diff of the next upgrade shows): one record a role's
    # entries in the shared library directory, each naming the installed tarball's version
    version = json.loads((installed_collection.path / "MANIFEST.json").read_text())["collection_info"]["version"]
    records = [json.loads(p.read_text()) for p in sorted((lib / ".gpufleet-node-code").glob("*.json"))]
    assert sorted(r["entries"][0] for r in records) == ["cli/health_agent.py", "cli/startup.py"], records
    assert {r["version"] for r in records} == {version}, records

    # The installed agent on this host, which has no NVIDIA driver (real NVML in the role's venv fails to load):
    # a CPU node (expected 0) is healthy, a GPU node is not. The state file is outside the tree compared below.
    agent = [str(root / "usr/local/bin/gpufleet-health"), "check", "--kmsg", "-", "--json",
             "--state-file", str(tmp_path / "agent-state.json")]
    for expected, code, verdict in ((0, 0, "healthy"), (8, 2, "unhealthy")):
        p = subprocess.run(agent + ["--expected-gpus", str(expected)], env={}, capture_output=True, text=True,
                           timeout=120, check=False)
        assert p.returncode == code and json.loads(p.stdout)["verdict"] == verdict, p.stdout + p.stderr

    after = tree(root)
    r, again = apply(installed_collection, tmp_path, extravars)
    assert again == [] and r.stats["changed"].get("node", 0) == 0, again
    assert tree(root) == after
