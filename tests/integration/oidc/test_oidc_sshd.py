# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real sshd (loopback, own config and host key) with the pam_python module in its PAM stack."""
from __future__ import annotations

import re

import pytest

from support.oidclab import PREFIX, approve, real_token, ssh_login, write_config

pytestmark = pytest.mark.idp
ALICE, BOB, DAVE = (f"{PREFIX}{n}" for n in ("alice", "bob", "dave"))


def _svc(pam_env, module_idp, tmp_path, mode):
    cfg = write_config(tmp_path / f"sshd-{mode}.yml", module_idp.issuer, tmp_path / "cache")
    return pam_env.service(cfg, mode, account_stack="pam_unix.so")


def _device_answer(approver, deny=False):
    def answer(prompt):
        m = re.search(r"open (\S+)", prompt)
        assert m, prompt
        approve(m.group(1), approver, deny=deny)
        return ""

    return answer


def test_sshd_device_login(pam_env, module_idp, tmp_path, sshd_factory):
    sshd = sshd_factory(_svc(pam_env, module_idp, tmp_path, "device"))
    rc, out = ssh_login(sshd.port, ALICE, _device_answer(ALICE))
    assert rc == 0 and ALICE in out.splitlines()[-1], out + pam_env.log_text() + sshd.log.read_text()
    assert "Accepted keyboard-interactive/pam for " + ALICE in sshd.log.read_text()
    rc, out = ssh_login(sshd.port, BOB, _device_answer(BOB))
    assert rc != 0 and "not in any allowed group" in pam_env.log_text()
    rc, out = ssh_login(sshd.port, ALICE, _device_answer(ALICE, deny=True))
    assert rc != 0 and "denied by the user" in pam_env.log_text()
    assert "Failed keyboard-interactive/pam for " + ALICE in sshd.log.read_text() or \
        "PAM: Authentication failure for " + ALICE in sshd.log.read_text()


def test_sshd_token_login_and_client_limit(pam_env, module_idp, tmp_path, sshd_factory):
    sshd = sshd_factory(_svc(pam_env, module_idp, tmp_path, "token"))
    at = real_token(module_idp.issuer, ALICE, tmp_path)
    assert len(at) < 1023, len(at)
    rc, out = ssh_login(sshd.port, ALICE, lambda p: at)
    assert rc == 0 and out.strip().splitlines()[-1].strip() == ALICE, out + pam_env.log_text()
    # The OpenSSH client sends at most 1023 characters at a prompt: a real 2 KB token cannot get through.
    long_at = real_token(module_idp.issuer, DAVE, tmp_path)
    assert len(long_at) > 1023
    rc, out = ssh_login(sshd.port, DAVE, lambda p: long_at)
    assert rc != 0
    assert f"rejected user={DAVE}" in pam_env.log_text()
