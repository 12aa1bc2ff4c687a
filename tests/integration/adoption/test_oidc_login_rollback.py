# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""oidc_login (installed from the collection tarball) never leaves a half-configured login.

The role is applied into a private root (sshd_config, a site drop-in, an sshd PAM stack). When `sshd -t`
rejects the candidate, or when a step of the switch fails after files were written, the root is byte for byte
(content, mode, type) as before and a local user still logs in with a password: through the very PAM stack
(pamtester) and through a real sshd on the root's configuration. Missing settings are named all at once. A
good run installs the `gpufleet-oidc` command.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.oidclab import SITE, _run, converse, free_port, remove_user, wait_port

pytestmark = pytest.mark.idp
CONFIG = {"issuer": "https://idp.example.test/realms/hpc", "audience": "urn:gpufleet:ssh",
          "username_claim": "preferred_username", "groups_claim": "groups", "allowed_groups": ["hpc-users"]}


@pytest.fixture
def password_user():
    """A local user with a password, made for the test and removed afterwards."""
    name, password = f"gfrb{secrets.token_hex(3)}", secrets.token_urlsafe(12)
    r = _run("useradd", "-m", "-s", "/bin/bash", name)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["chpasswd"], input=f"{name}:{password}\n", capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    yield name, password
    remove_user(name)


class Node:
    """A private root with the files the role touches, and how to log in to it."""

    def __init__(self, base: Path, user: str):
        self.root = base / "root"
        self.work = base / "work"  # sshd's pid file, logs, the plays: outside the root
        self.work.mkdir(parents=True)
        ssh = self.root / "etc/ssh"
        (ssh / "sshd_config.d").mkdir(parents=True)
        (self.root / "etc/pam.d").mkdir(parents=True)
        self.key = self.work / "host_ed25519"
        assert _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)).returncode == 0
        self.port = free_port()
        self.sshd_config = ssh / "sshd_config"
        self.sshd_config.write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {self.key}\nPidFile {self.work}/sshd.pid\n"
            "UsePAM yes\nPasswordAuthentication yes\nKbdInteractiveAuthentication no\nPubkeyAuthentication no\n"
            f"PermitRootLogin no\nAllowUsers {user}\nStrictModes no\n")
        (ssh / "sshd_config.d" / "10-site.conf").write_text("# the site's own drop-in\nClientAliveInterval 120\n")
        self.service = f"sshd-gfrb-{secrets.token_hex(3)}"
        (self.root / "etc/pam.d" / self.service).write_text(
            "# the site's sshd PAM stack\n@include common-auth\naccount required pam_unix.so\n"
            "session required pam_unix.so\n")
        os.chmod(self.root / "etc/pam.d" / self.service, 0o640)

    def vars(self, **over) -> dict:
        v = {
            "oidc_login_config": dict(CONFIG, jwks_cache_dir=str(self.root / "var/cache/gpufleet-oidc")),
            "oidc_login_mode": "device",
            "oidc_login_install_packages": False, "oidc_login_manage_venv": False, "oidc_login_site_dir": str(SITE),
            "oidc_login_install_dir": str(self.root / "opt/gpufleet-oidc"),
            "oidc_login_config_path": str(self.root / "etc/gpufleet/oidc.yml"),
            "oidc_login_cli_path": str(self.root / "usr/local/bin/gpufleet-oidc"),
            "oidc_login_pam_dir": str(self.root / "etc/pam.d"), "oidc_login_pam_service": self.service,
            "oidc_login_pam_include": f"gfrb-inc-{self.service[-6:]}",
            "oidc_login_sshd_config": str(self.sshd_config),
            "oidc_login_sshd_dropin_dir": str(self.root / "etc/ssh/sshd_config.d"),
            "oidc_login_sshd_reload": False,
            "oidc_login_preflight": False,  # no IdP here: the switch and its rollback are what is tested
        }
        v.update(over)
        return v

    def state(self) -> dict:
        """Every path under the root: (type, mode, content or link target)."""
        out = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                st = p.lstat()
                if p.is_symlink():
                    out[str(p)] = ("link", os.readlink(p))
                elif p.is_dir():
                    out[str(p)] = ("dir", oct(st.st_mode & 0o7777))
                else:
                    out[str(p)] = ("file", oct(st.st_mode & 0o7777), p.read_bytes())
        return out

    def apply(self, installed, extra: dict) -> subprocess.CompletedProcess:
        n = len(list(self.work.glob("play-*.yml")))
        play = self.work / f"play-{n}.yml"
        play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "connection": "local",
                                         "roles": [{"role": "gpufleet.reliability.oidc_login"}]}]))
        varfile = self.work / f"vars-{n}.yml"
        varfile.write_text(yaml.safe_dump(extra))
        env = dict(installed.env, ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")
        return installed.run("ansible-playbook", "-i", "localhost,", str(play), "-e", f"@{varfile}", env=env,
                             check=False)

    def password_login_works(self, user: str, password: str) -> None:
        """The root's sshd PAM stack (pamtester) and a real sshd on the root's configuration accept the password."""
        assert _run("/usr/sbin/sshd", "-t", "-f", str(self.sshd_config)).returncode == 0
        pam_copy = Path("/etc/pam.d") / self.service  # pamtester and sshd read services only from there
        shutil.copy(self.root / "etc/pam.d" / self.service, pam_copy)
        try:
            proc = subprocess.Popen(["pamtester", "-v", self.service, user, "authenticate"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            rc, out = converse(proc, lambda _p: password, 30, is_prompt=lambda b: b.rstrip().endswith(":"))
            assert rc == 0 and "successfully authenticated" in out, out
            binary = self.work / self.service  # sshd's PAM service is its program name
            if not binary.exists():
                binary.symlink_to("/usr/sbin/sshd")
            with open(self.work / "sshd.log", "ab") as log:
                sshd = subprocess.Popen([str(binary), "-D", "-e", "-f", str(self.sshd_config)], stdout=log,
                                        stderr=subprocess.STDOUT)
            try:
                wait_port(self.port, sshd)
                rc, out = _ssh_password(self.port, user, password)
                assert rc == 0 and out.strip().splitlines()[-1].strip() == user, \
                    out + (self.work / "sshd.log").read_text()
            finally:
                sshd.terminate()
                sshd.wait(10)
        finally:
            pam_copy.unlink(missing_ok=True)


def _ssh_password(port: int, user: str, password: str) -> tuple:
    import pexpect

    child = pexpect.spawn("ssh", ["-p", str(port), "-o", "StrictHostKeyChecking=no", "-o",
                                  "UserKnownHostsFile=/dev/null", "-o", "PreferredAuthentications=password", "-o",
                                  "NumberOfPasswordPrompts=1", "-o", "LogLevel=ERROR", "-F", "/dev/null",
                                  f"{user}@127.0.0.1", "id -un"], timeout=60, encoding="utf-8")
    out = ""
    try:
        idx = child.expect([r"[Pp]assword: ", pexpect.EOF, pexpect.TIMEOUT])
        out += child.before
        if idx == 0:
            child.sendline(password)
            child.expect([pexpect.EOF, pexpect.TIMEOUT])
            out += child.before
    finally:
        child.close(force=True)
    return (child.exitstatus if child.exitstatus is not None else 255), out


@pytest.fixture
def node(tmp_path, password_user, run_sshd_dir):
    return Node(tmp_path, password_user[0])


def test_sshd_t_failing_on_the_candidate_changes_nothing(node, password_user, installed_collection):
    before = node.state()
    r = node.apply(installed_collection, node.vars(oidc_login_authentication_methods="no-such-method"))
    assert r.returncode != 0
    assert "sshd -t failed with the OIDC drop-in" in r.stdout and "Nothing was changed" in r.stdout, r.stdout[-3000:]
    assert node.state() == before
    node.password_login_works(*password_user)


def test_a_failure_after_the_switch_started_puts_every_file_back(node, password_user, installed_collection):
    # sshd that accepts the staged candidate but rejects the switched configuration (as when another tool
    # changed sshd_config in between): the switch fails after the PAM include, drop-in and code were written
    fake = node.work / "fake-sshd"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = {node.sshd_config} ] && '
                    '{ echo "fake sshd: rejects the switched file" >&2; exit 255; }; done\n'
                    'exec /usr/sbin/sshd "$@"\n')
    fake.chmod(0o755)
    before = node.state()
    r = node.apply(installed_collection, node.vars(oidc_login_sshd_binary=str(fake)))
    assert r.returncode != 0
    out = r.stdout
    assert "Write the validated configuration and the PAM include for sshd" in out, out[-4000:]
    assert "Put every file back as it was" in out and "Every file the role had changed was put back" in out, \
        out[-4000:]
    assert "put back as it was (rolled back: " in out and " path(s) the role created removed)" in out, out[-4000:]
    assert "rejects the switched file" in out
    assert node.state() == before
    node.password_login_works(*password_user)


def test_every_missing_setting_is_named_in_one_run(node, installed_collection):
    before = node.state()
    r = node.apply(installed_collection, node.vars(oidc_login_config={"issuer": CONFIG["issuer"]}))
    assert r.returncode != 0
    assert ("oidc_login_config is missing audience, username_claim, groups_claim, allowed_groups, jwks_cache_dir"
            in r.stdout), r.stdout[-3000:]
    r = node.apply(installed_collection, node.vars(oidc_login_config={"issuer": CONFIG["issuer"], "preset": "okta"}))
    assert r.returncode != 0
    assert "oidc_login_config is missing audience, allowed_groups, jwks_cache_dir, allowed_domains" in r.stdout, \
        r.stdout[-3000:]
    assert node.state() == before


def test_a_good_run_installs_the_gpufleet_oidc_command(node, installed_collection):
    r = node.apply(installed_collection, node.vars())
    assert r.returncode == 0, r.stdout[-4000:]
    stack = (node.root / "etc/pam.d" / node.service).read_text()
    assert "@include gfrb-inc-" in stack
    cli = node.root / "usr/local/bin/gpufleet-oidc"
    assert os.access(cli, os.X_OK)
    out = _run(str(cli), "--help")
    assert out.returncode == 0 and "validate" in out.stdout, out.stdout + out.stderr
    token = subprocess.run([str(cli), "validate", "--config", str(node.root / "etc/gpufleet/oidc.yml")],
                           input="not-a-token", capture_output=True, text=True, timeout=60, check=False)
    assert token.returncode != 0 and "rejected" in token.stderr, token.stdout + token.stderr
    again = node.apply(installed_collection, node.vars())
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
