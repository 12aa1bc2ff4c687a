# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/oidc_login applied into a temporary root, then a real sshd runs the rendered configuration."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.oidclab import AUD, PLAYBOOK, PREFIX, REPO, SITE, USERS, _run, free_port, real_token, ssh_login, wait_port

pytestmark = pytest.mark.idp
ALICE = f"{PREFIX}alice"


def apply(root: Path, extra: dict, *args: str) -> subprocess.CompletedProcess:
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             "roles": [{"role": "gpufleet.reliability.oidc_login"}]}]
    (root / "play.yml").write_text(yaml.safe_dump(play))
    (root / "vars.json").write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")
    # the role runs `sshd -t`, which needs sshd's privilege-separation directory: every caller holds run_sshd_dir,
    # which keeps it while any test process uses it
    return subprocess.run([str(PLAYBOOK), "-i", "localhost,", str(root / "play.yml"), "-e", f"@{root / 'vars.json'}",
                           *args], capture_output=True, text=True, timeout=300, cwd=str(REPO), env=env, check=False)


@pytest.fixture
def role_root(tmp_path, module_idp, run_sshd_dir):
    root = tmp_path / "root"
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True)
    (root / "etc/pam.d").mkdir(parents=True)
    key = root / "etc/ssh/host_ed25519"
    assert _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)).returncode == 0
    port = free_port()
    (root / "etc/ssh/sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {key}\nPidFile {root}/sshd.pid\nPasswordAuthentication no\n"
        f"PubkeyAuthentication yes\nPermitRootLogin no\nAllowUsers {' '.join(USERS)} svc-backup\nStrictModes no\n")
    tag = secrets.token_hex(3)
    service, include = f"sshd-gfotest-{tag}", f"gfotest-inc-{tag}"
    (root / "etc/pam.d" / service).write_text(
        "@include common-auth\naccount required pam_unix.so\nsession required pam_unix.so\n")
    extra = {
        "oidc_login_config": {
            "issuer": module_idp.issuer, "audience": AUD, "username_claim": "preferred_username",
            "groups_claim": "groups", "allowed_groups": ["hpc-users"],
            "jwks_cache_dir": str(root / "var/cache/gpufleet-oidc"), "client_id": "gpufleet-device",
            "client_secret": "device-secret", "scope": "openid profile groups ssh"},
        "oidc_login_mode": "token",
        "oidc_login_install_packages": False, "oidc_login_manage_venv": False, "oidc_login_site_dir": str(SITE),
        "oidc_login_install_dir": str(root / "opt/gpufleet-oidc"),
        "oidc_login_config_path": str(root / "etc/gpufleet/oidc.yml"),
        "oidc_login_cli_path": str(root / "usr/local/bin/gpufleet-oidc"),  # never the host's
        "oidc_login_pam_dir": str(root / "etc/pam.d"), "oidc_login_pam_service": service,
        "oidc_login_pam_include": include, "oidc_login_debug_log": str(root / "pam.log"),
        "oidc_login_sshd_config": str(root / "etc/ssh/sshd_config"),
        "oidc_login_sshd_dropin_dir": str(root / "etc/ssh/sshd_config.d"),
        "oidc_login_bypass_users": ["svc-backup"], "oidc_login_sshd_reload": False,
    }
    return root, extra, service, include, port


def test_role_applies_idempotently_and_sshd_logs_in(role_root, module_idp, tmp_path, local_users):
    root, extra, service, include, port = role_root
    # the preflight, from this node, with a real token from the IdP that must map to alice
    extra = dict(extra, oidc_login_preflight_token=real_token(module_idp.issuer, ALICE, tmp_path),
                 oidc_login_preflight_user=ALICE)
    r = apply(root, extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"ok: discovery and JWKS of {module_idp.issuer} reached from this host" in r.stdout, r.stdout[-3000:]
    assert f"ok: the test token is valid and maps to {ALICE}" in r.stdout
    assert extra["oidc_login_preflight_token"] not in r.stdout + r.stderr  # never logged
    stack = (root / "etc/pam.d" / service).read_text()
    assert stack.index(f"@include {include}") < stack.index("@include common-auth")
    inc = (root / "etc/pam.d" / include).read_text()
    assert "auth [success=done default=die] /lib/security/pam_python.so" in inc and "mode=token" in inc
    assert oct(os.stat(root / "etc/gpufleet/oidc.yml").st_mode & 0o777) == "0o600"
    dropin = (root / "etc/ssh/sshd_config.d/50-gpufleet-oidc.conf").read_text()
    assert "KbdInteractiveAuthentication yes" in dropin and "Match User svc-backup" in dropin
    assert "Match User root" in dropin  # the break-glass account by default
    assert (root / "etc/ssh/sshd_config").read_text().startswith(f"Include {root}/etc/ssh/sshd_config.d/*.conf")
    # sshd -t accepts the result; the bypass user gets publickey only, everyone else keyboard-interactive
    t = _run("/usr/sbin/sshd", "-T", "-f", str(root / "etc/ssh/sshd_config"), "-C",
             "user=svc-backup,host=h,addr=127.0.0.1")
    assert "authenticationmethods publickey" in t.stdout, t.stdout + t.stderr
    t = _run("/usr/sbin/sshd", "-T", "-f", str(root / "etc/ssh/sshd_config"), "-C",
             f"user={ALICE},host=h,addr=127.0.0.1")
    assert "authenticationmethods keyboard-interactive" in t.stdout
    # the installed command runs the same preflight against the real IdP
    pf = _run(str(root / "usr/local/bin/gpufleet-oidc"), "preflight", "--config", str(root / "etc/gpufleet/oidc.yml"),
              "--mode", "token")
    assert pf.returncode == 0 and pf.stdout.startswith("ok: discovery and JWKS"), pf.stdout + pf.stderr
    again = apply(root, extra)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    for dropin in (root / "etc/ssh/sshd_config.d").iterdir():  # one header line, never "# #"
        first = dropin.read_text().splitlines()[0]
        assert first.startswith("# ") and not first.startswith("# #") and "oidc_login" in first, first

    # End to end: the rendered PAM files under unique names in /etc/pam.d, a real sshd on the rendered config.
    pam_files = [Path("/etc/pam.d") / service, Path("/etc/pam.d") / include]
    try:
        for p in pam_files:
            shutil.copy(root / "etc/pam.d" / p.name, p)
        binary = root / service
        binary.symlink_to("/usr/sbin/sshd")
        with open(root / "sshd.log", "wb") as log:
            proc = subprocess.Popen([str(binary), "-D", "-e", "-f", str(root / "etc/ssh/sshd_config")], stdout=log,
                                    stderr=subprocess.STDOUT)
        try:
            wait_port(port, proc)
            at = real_token(module_idp.issuer, ALICE, tmp_path)
            rc, out = ssh_login(port, ALICE, lambda p: at)
            assert rc == 0 and out.strip().splitlines()[-1].strip() == ALICE, out + (root / "pam.log").read_text()
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        for p in pam_files:
            p.unlink(missing_ok=True)


def test_check_mode_on_a_fresh_login_node_with_the_default_venv_predicts_without_it(role_root):
    """The defaults (the role creates the venv): check mode cannot run the venv's interpreter that does not exist
    yet; it predicts where site-packages will be, says what it could not check, and writes nothing."""
    root, extra, service, *_rest = role_root
    extra = {k: v for k, v in extra.items() if k not in ("oidc_login_manage_venv", "oidc_login_site_dir")}
    venv = root / "opt/gpufleet-oidc/venv"
    extra["oidc_login_venv"] = str(venv)
    # an offline login node: the wheels it would be given (make wheelhouse) are predicted, not copied
    wheels = root.parent / "wheelhouse"
    wheels.mkdir(exist_ok=True)
    (wheels / "SHA256SUMS").write_text("")
    extra["oidc_login_wheelhouse"] = str(wheels)

    before = files(root)
    r = apply(root, extra, "--check", "--diff")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert f"Check mode: {venv} does not exist yet" in r.stdout, r.stdout[-4000:]
    assert f"site={venv}/lib/python3." in r.stdout, r.stdout[-4000:]  # the PAM line's predicted site-packages
    # the copy is predicted as a change (its header alone would show for a skipped task too)
    header = "TASK [gpufleet.reliability.oidc_login : Copy the wheels for a login node without a package index]"
    assert header in r.stdout, r.stdout[-4000:]
    copy = r.stdout.split(header, 1)[1].split("TASK [", 1)[0]
    assert "changed: [localhost]" in copy and "skipping" not in copy, copy[-2000:]
    assert not venv.exists() and not (root / "opt/gpufleet-oidc/wheels").exists()
    assert files(root) == before


def test_role_refuses_bad_config_naming_key(role_root):
    root, extra, *_rest = role_root
    extra = dict(extra, oidc_login_config=dict(extra["oidc_login_config"], algorithms=["none"]))
    r = apply(root, extra)
    assert r.returncode != 0 and "config key 'algorithms'" in r.stdout
    assert not (root / "etc/gpufleet/oidc.yml").exists()


def test_role_restores_sshd_config_when_sshd_t_fails(role_root):
    root, extra, *_rest = role_root
    extra = dict(extra, oidc_login_authentication_methods="no-such-method")
    r = apply(root, extra)
    assert r.returncode != 0 and "sshd -t failed" in r.stdout
    assert not (root / "etc/ssh/sshd_config.d/50-gpufleet-oidc.conf").exists()
    assert _run("/usr/sbin/sshd", "-t", "-f", str(root / "etc/ssh/sshd_config")).returncode == 0


def files(root):
    """What the role could write (apply() writes its play and variables next to them)."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name not in ("play.yml", "vars.json")}


@pytest.mark.parametrize("issuer, why", [
    ("https://sso.example.invalid/realms/hpc", "cannot reach https://sso.example.invalid/realms/hpc/.well-known"),
    ("http://127.0.0.1:9", "cannot reach http://127.0.0.1:9/.well-known"),
], ids=["unresolvable", "refused"])
def test_an_idp_the_node_cannot_use_stops_the_role_before_anything_is_switched(role_root, issuer, why):
    """The lockout case: an issuer the node cannot reach. Before, the run succeeded and everyone but the bypass
    users was asked for a device login that could never work."""
    root, extra, *_rest = role_root
    extra = dict(extra, oidc_login_config=dict(extra["oidc_login_config"], issuer=issuer))
    before = files(root)
    r = apply(root, extra)
    assert r.returncode != 0 and "The IdP cannot be used from this node" in r.stdout, r.stdout[-3000:]
    assert why in r.stdout and "Nothing was changed on the node" in r.stdout, r.stdout[-3000:]
    assert files(root) == before


def test_a_test_token_that_does_not_map_stops_the_role(role_root, module_idp, tmp_path, local_users):
    root, extra, *_rest = role_root
    extra = dict(extra, oidc_login_preflight_token=real_token(module_idp.issuer, ALICE, tmp_path),
                 oidc_login_preflight_user="svc-backup")
    before = files(root)
    r = apply(root, extra)
    assert r.returncode != 0 and "!= login user" in r.stdout, r.stdout[-3000:]
    assert files(root) == before


def test_break_glass_root_logs_in_with_a_key_and_a_node_without_one_is_refused(role_root, tmp_path):
    root, extra, *_rest = role_root
    # nobody would keep a key-only way in: refused, nothing changed
    before = files(root)
    r = apply(root, dict(extra, oidc_login_break_glass_users=[], oidc_login_bypass_users=[]))
    assert r.returncode != 0 and "No break-glass account" in r.stdout, r.stdout[-3000:]
    assert files(root) == before
    # ... unless a key alone is one of everyone's ways in
    r = apply(root, dict(extra, oidc_login_break_glass_users=[], oidc_login_bypass_users=[],
                         oidc_login_authentication_methods="publickey keyboard-interactive"), "--check")
    assert r.returncode == 0, r.stdout[-3000:]

    # root with a key, through a real sshd on the switched configuration (PAM service sshd)
    key = tmp_path / "rootkey"
    assert _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)).returncode == 0
    keys = root / "keys"
    keys.mkdir()
    (keys / "root").write_text(Path(f"{key}.pub").read_text())
    cfg = root / "etc/ssh/sshd_config"
    cfg.write_text(cfg.read_text().replace("PermitRootLogin no", "PermitRootLogin prohibit-password")
                   .replace("AllowUsers ", "AllowUsers root ") + f"AuthorizedKeysFile {keys}/%u\n")
    port = int(re.search(r"(?m)^Port (\d+)$", cfg.read_text()).group(1))
    r = apply(root, extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    t = _run("/usr/sbin/sshd", "-T", "-f", str(cfg), "-C", "user=root,host=h,addr=127.0.0.1")
    assert "authenticationmethods publickey" in t.stdout, t.stdout + t.stderr
    with open(root / "sshd.log", "wb") as log:
        proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc)
        out = _run("ssh", "-p", str(port), "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                   "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-F", "/dev/null",
                   "root@127.0.0.1", "id -un")
        assert out.returncode == 0 and out.stdout.strip() == "root", out.stdout + out.stderr + \
            (root / "sshd.log").read_text()
    finally:
        proc.terminate()
        proc.wait(10)
