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


def test_mode_only_change_is_in_the_diff(localhost, root):
    oidc_pam(localhost, **args(root))
    conf = root / "gpufleet" / "oidc.yml"
    os.chmod(conf, 0o644)
    res = oidc_pam(localhost, **args(root))
    assert res["changed"] is True and stat.S_IMODE(os.stat(conf).st_mode) == 0o600
    assert res["diff"] == [{"before_header": f"{conf} (mode)", "after_header": f"{conf} (mode)",
                            "before": "0644\n", "after": "0600\n"}]


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


# ---------------------------------------------------------------------------------------------------------------
# Secrets in the configuration: on disk as given, never in the result, the diff or the logged invocation.
# ---------------------------------------------------------------------------------------------------------------
SECRET = "s3cr3t-Zq9wX"
PROXY_PW = "pr0xy-Pw7k"
REDACTED = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
SECRET_CFG = dict(CFG, client_id="hpc-login", client_secret=SECRET, proxy=f"http://relay:{PROXY_PW}@127.0.0.1:3128")


def dump(res):
    """Everything the module returned, as text (pytest-ansible's result is a dict subclass json cannot encode)."""
    return json.dumps(res, default=lambda o: dict(o) if hasattr(o, "keys") else str(o))


def config_diff(res, root):
    path = str(root / "gpufleet" / "oidc.yml")
    return [d for d in res.get("diff", []) if d["before_header"] == path]


def test_secrets_hidden_in_result_and_diff_but_written(localhost, root):
    res = oidc_pam(localhost, **args(root, config=SECRET_CFG))
    assert res["changed"] is True, res
    text = dump(res)
    assert SECRET not in text and PROXY_PW not in text, text
    assert res["config"]["client_secret"] == REDACTED
    assert res["config"]["proxy"] == f"http://relay:{REDACTED}@127.0.0.1:3128"
    # only the secrets are masked: the rest of the configuration stays readable
    assert {k: v for k, v in res["config"].items() if k not in ("client_secret", "proxy")} == \
        {k: v for k, v in SECRET_CFG.items() if k not in ("client_secret", "proxy")}
    (d,) = config_diff(res, root)
    assert f'"client_secret": "{REDACTED}"' in d["after"] and '"issuer": "https://sso.example.com' in d["after"]
    assert res["invocation"]["module_args"]["config"]["issuer"] == CFG["issuer"]
    assert res["invocation"]["module_args"]["config"]["client_secret"] == REDACTED
    assert json.loads((root / "gpufleet" / "oidc.yml").read_text()) == SECRET_CFG  # the file has the real values
    assert oidc_pam(localhost, **args(root, config=SECRET_CFG))["changed"] is False  # idempotent

    new = dict(SECRET_CFG, client_secret="n3w-" + SECRET)
    res = oidc_pam(localhost, **args(root, config=new))
    assert res["changed"] is True and SECRET not in dump(res), res
    (d,) = config_diff(res, root)
    assert REDACTED in d["before"] and REDACTED in d["after"]
    assert json.loads((root / "gpufleet" / "oidc.yml").read_text())["client_secret"] == "n3w-" + SECRET

    # removal: the module no longer has the secret as an argument, the diff still must not show the file's
    res = oidc_pam(localhost, **args(root, state="absent", config=None))
    assert res["changed"] is True and SECRET not in dump(res) and PROXY_PW not in dump(res), res
    (d,) = config_diff(res, root)
    assert REDACTED in d["before"] and not (root / "gpufleet" / "oidc.yml").exists()


def test_unparsable_old_config_is_not_shown(localhost, root):
    (root / "gpufleet").mkdir()
    (root / "gpufleet" / "oidc.yml").write_text(f"# hand-written\nclient_secret: {SECRET}\n")
    res = oidc_pam(localhost, **args(root))
    assert res["changed"] is True and SECRET not in dump(res), res
    (d,) = config_diff(res, root)
    assert d["before"].startswith("(content not shown")


def test_invocation_log_line_has_no_secret(root, monkeypatch, capsys):
    """AnsibleModule logs its arguments (journal/syslog on the node) when it starts: config must not be in it."""
    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.gpufleet.reliability.plugins.modules import oidc_pam as mod

    logged = []
    monkeypatch.setattr(basic.AnsibleModule, "log", lambda self, msg, log_args=None: logged.append(msg))
    from ansible.release import __version__ as core_version

    # ansible-core 2.21 puts `invocation` in a result only when asked (2.19 refuses the argument)
    new_core = tuple(int(n) for n in core_version.split(".")[:2]) >= (2, 21)
    inject = {"_ansible_inject_invocation": True} if new_core else {}
    with patch_module_args(args(root, config=SECRET_CFG, _ansible_check_mode=True, **inject)), \
            pytest.raises(SystemExit):
        mod.main()
    out = capsys.readouterr().out
    assert logged and all(SECRET not in m and PROXY_PW not in m for m in logged), logged
    res = json.loads(out)
    assert res["changed"] is True and SECRET not in out and PROXY_PW not in out, out
    assert res["invocation"]["module_args"]["config"]["client_secret"] == REDACTED
    assert not (root / "gpufleet").exists()  # check mode


def test_slurm_jwks_refuses_plain_http(localhost, tmp_path):
    slurm_jwks = getattr(localhost, "gpufleet.reliability.slurm_jwks")
    for kw, named in (({"jwks_uri": "http://sso.example.com/jwks"}, "jwks_uri 'http://sso.example.com/jwks'"),
                      ({"issuer": "http://sso.example.com/realms/hpc"}, "issuer 'http://sso.example.com/realms/hpc'")):
        res = slurm_jwks(dest=str(tmp_path / "j.json"), timeout=2, **kw)["localhost"]
        assert res.get("failed") and f"{named} is not https" in res["msg"], res
        assert not (tmp_path / "j.json").exists()
