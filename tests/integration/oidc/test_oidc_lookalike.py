# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Look-alike user names with genuine tokens from the test IdP: other IdP accounts whose preferred_username looks
like (or case-folds onto) the local user gfokate must never log in as gfokate; gfokate's own tokens still do."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.oidclab import LOOK_ALIKES, PREFIX, approve, pamtester, real_token, ssh_login, write_config

pytestmark = pytest.mark.idp
CLI = str(Path(sys.prefix) / "bin" / "gpufleet-oidc")
KATE = f"{PREFIX}kate"
OK = "successfully authenticated"


@pytest.fixture(scope="module")
def tokens(module_idp, tmp_path_factory):
    """Genuine access tokens: one per look-alike account, plus gfokate's own and an upper-case ASCII control."""
    tmp = tmp_path_factory.mktemp("lookalike")
    out = {acct: real_token(module_idp.issuer, acct, tmp) for acct in [*LOOK_ALIKES, KATE, "kate-upper"]}
    return out


def _cli(config: Path, token: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "validate", "--config", str(config), *extra], input=token, capture_output=True,
                          text=True, timeout=60, check=False)


def test_cli_refuses_look_alikes_accepts_genuine(module_idp, tokens, tmp_path, local_users):
    cfg = write_config(tmp_path / "c.yml", module_idp.issuer, tmp_path / "cache")
    for acct in LOOK_ALIKES:
        for extra in ((), ("--user", KATE)):
            r = _cli(cfg, tokens[acct], *extra)
            assert r.returncode == 4 and r.stdout == "", (acct, r.stdout, r.stderr)
            assert "is not plain ASCII" in r.stderr, (acct, r.stderr)
    for acct in (KATE, "kate-upper"):  # genuine controls: the same IdP, keys and config accept these
        r = _cli(cfg, tokens[acct], "--user", KATE)
        assert (r.returncode, r.stdout.strip()) == (0, KATE), (acct, r.stderr)


def test_pam_token_mode_refuses_look_alikes(module_idp, tokens, pam_env, tmp_path):
    service = pam_env.service(write_config(tmp_path / "t.yml", module_idp.issuer, tmp_path / "cache"), "token")
    for acct in LOOK_ALIKES:
        rc, out = pamtester(service, KATE, lambda p, t=tokens[acct]: t)
        assert rc != 0 and OK not in out, (acct, out)
    log = pam_env.log_text()
    assert log.count("is not plain ASCII") == len(LOOK_ALIKES) and f"accepted user={KATE}" not in log, log
    rc, out = pamtester(service, KATE, lambda p: tokens[KATE])
    assert rc == 0 and OK in out, out + pam_env.log_text()


def test_pam_device_mode_refuses_look_alike(module_idp, pam_env, tmp_path):
    service = pam_env.service(write_config(tmp_path / "d.yml", module_idp.issuer, tmp_path / "cache"), "device")

    def approver(account):
        def answer(prompt):
            m = re.search(r"open (\S+)", prompt)
            assert m and f"log in as {KATE}" in prompt, prompt
            assert approve(m.group(1), account) == "Sign-in Success"
            return ""

        return answer

    rc, out = pamtester(service, KATE, approver("lookalike-kelvin"))
    assert rc != 0 and OK not in out, out
    assert "is not plain ASCII" in pam_env.log_text(), pam_env.log_text()
    rc, out = pamtester(service, KATE, approver(KATE))
    assert rc == 0 and OK in out, out + pam_env.log_text()


def test_sshd_token_login_refuses_look_alike(module_idp, tokens, pam_env, tmp_path, sshd_factory):
    cfg = write_config(tmp_path / "s.yml", module_idp.issuer, tmp_path / "cache")
    sshd = sshd_factory(pam_env.service(cfg, "token", account_stack="pam_unix.so"))
    rc, out = ssh_login(sshd.port, KATE, lambda p: tokens["lookalike-kelvin"])
    assert rc != 0 and f"Accepted keyboard-interactive/pam for {KATE}" not in sshd.log.read_text(), out
    assert "is not plain ASCII" in pam_env.log_text()
    rc, out = ssh_login(sshd.port, KATE, lambda p: tokens[KATE])
    assert rc == 0 and out.strip().splitlines()[-1].strip() == KATE, out + pam_env.log_text()
