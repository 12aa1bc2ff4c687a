# The oidc_pam and slurm_jwks modules run for real through Ansible (pytest-ansible's `localhost`).
import json
import os
import stat

import pytest

CFG = {"issuer": "https://sso.example.com/realms/hpc", "audience": "hpc-login", "username_claim": "preferred_username",
       "groups_claim": "groups", "allowed_groups": ["hpc-users"], "jwks_cache_dir": "/var/cache/gpufleet-oidc"}
STACK = "# sshd\n@include common-auth\naccount required pam_nologin.so\n@include common-account\n"


def oidc_pam(host, **kw):
    return getattr(host, "gpufleet.reliability.oidc_pam")(**kw)["localhost"]


@pytest.fixture
def root(tmp_path):
    (tmp_path / "pam.d").mkdir()
    (tmp_path / "pam.d" / "sshd").write_text(STACK)
    return tmp_path


def args(root, **over):
    a = dict(config=CFG, config_path=str(root / "gpufleet" / "oidc.yml"),
             include_path=str(root / "pam.d" / "gpufleet-oidc"),
             service_path=str(root / "pam.d" / "sshd"), site_dir="/opt/v/lib/python3.11/site-packages")
    a.update(over)
    return a


def test_install_idempotent_and_absent(localhost, root):
    res = oidc_pam(localhost, **args(root))
    assert res["changed"] is True, res
    stack = (root / "pam.d" / "sshd").read_text()
    assert stack.index("@include gpufleet-oidc") < stack.index("@include common-auth")
    inc = (root / "pam.d" / "gpufleet-oidc").read_text()
    assert "auth [success=done default=die] /lib/security/pam_python.so /opt/gpufleet-oidc/pam_gpufleet_oidc.py" in inc
    assert "mode=device" in inc and "site=/opt/v/lib/python3.11/site-packages" in inc
    assert json.loads((root / "gpufleet" / "oidc.yml").read_text()) == CFG
    assert stat.S_IMODE(os.stat(root / "gpufleet" / "oidc.yml").st_mode) == 0o600
    assert oidc_pam(localhost, **args(root))["changed"] is False
    res = oidc_pam(localhost, **args(root, mode="token"))
    assert res["changed"] is True and "mode=token" in (root / "pam.d" / "gpufleet-oidc").read_text()
    res = oidc_pam(localhost, **args(root, state="absent", config=None))
    assert res["changed"] is True
    assert (root / "pam.d" / "sshd").read_text() == STACK
    assert not (root / "pam.d" / "gpufleet-oidc").exists() and not (root / "gpufleet" / "oidc.yml").exists()


@pytest.mark.parametrize("name", ["common-auth", "sudo", "login", "system-auth"])
def test_refuses_shared_stacks(localhost, root, name):
    (root / "pam.d" / name).write_text("auth required pam_unix.so\n")
    res = oidc_pam(localhost, **args(root, service_path=str(root / "pam.d" / name)))
    assert res.get("failed") and "only an sshd PAM stack" in res["msg"]
    assert (root / "pam.d" / name).read_text() == "auth required pam_unix.so\n"


def test_bad_config_names_key_and_writes_nothing(localhost, root):
    res = oidc_pam(localhost, **args(root, config=dict(CFG, leeway="lots")))
    assert res.get("failed") and res["key"] == "leeway" and "config key 'leeway'" in res["msg"]
    assert (root / "pam.d" / "sshd").read_text() == STACK and not (root / "gpufleet").exists()


def test_slurm_jwks_needs_a_source_and_fails_closed(localhost, tmp_path):
    slurm_jwks = getattr(localhost, "gpufleet.reliability.slurm_jwks")
    res = slurm_jwks(dest=str(tmp_path / "j.json"))["localhost"]
    assert res.get("failed") and "issuer" in res["msg"]
    res = slurm_jwks(issuer="http://127.0.0.1:9", dest=str(tmp_path / "j.json"), timeout=2)["localhost"]
    assert res.get("failed") and "cannot reach" in res["msg"] and not (tmp_path / "j.json").exists()
