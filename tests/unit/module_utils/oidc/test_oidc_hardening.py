"""Security hardening of the OIDC core: the one https rule (JWKS cache, Slurm JWKS, CLI), secret redaction of the
configuration, and the root-owned log file that must not follow symlinks."""
from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import oidc as cli
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import core, transport
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import (
    REDACTED,
    parse_config,
    redact_config,
    secret_values,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import IdPUnavailable
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.slurm import fetch_jwks
from support.oidc_forge import make_private_jwks, public_jwks

HTTPS_ISSUER = "https://sso.example.com/realms/hpc"


@pytest.mark.parametrize("url, ok", [
    ("https://sso.example.com/jwks", True),
    ("http://127.0.0.1:8080/jwks", True),
    ("http://localhost/jwks", True),
    ("http://[::1]:9/", True),
    ("http://127.0.0.1:9", True),
    ("http://sso.example.com/jwks", False),
    ("http://localhost@evil.example/jwks", False),
    ("http://127.0.0.1.evil.example/jwks", False),
    ("http://localhost.evil.example/", False),
    ("ftp://sso.example.com/jwks", False),
    ("file:///etc/passwd", False),
    ("", False),
    (None, False),
])
def test_secure_url_rule(url, ok):
    assert transport.is_secure_url(url) is ok


@pytest.fixture
def fake_idp(monkeypatch):
    """transport.get_json answered from a dict; every URL asked for is recorded (nothing reaches the network)."""
    calls = []
    docs = {}

    def get_json(url, timeout=5.0):
        calls.append(url)
        if url not in docs:
            raise IdPUnavailable(f"cannot reach {url}: test")
        return docs[url]

    monkeypatch.setattr(transport, "get_json", get_json)
    return docs, calls


@pytest.mark.parametrize("kw, named", [
    ({"jwks_uri": "http://sso.example.com/jwks"}, "jwks_uri 'http://sso.example.com/jwks'"),
    ({"issuer": "http://sso.example.com/realms/hpc"}, "issuer 'http://sso.example.com/realms/hpc'"),
])
def test_fetch_jwks_refuses_plain_http_before_fetching(fake_idp, kw, named):
    _docs, calls = fake_idp
    with pytest.raises(IdPUnavailable, match="is not https") as ei:
        fetch_jwks(**kw)
    assert named in ei.value.reason and "loopback" in ei.value.reason
    assert calls == []


def test_fetch_jwks_refuses_plain_http_jwks_uri_from_discovery(fake_idp):
    docs, calls = fake_idp
    docs[HTTPS_ISSUER + "/.well-known/openid-configuration"] = {"issuer": HTTPS_ISSUER,
                                                                "jwks_uri": "http://sso.example.com/jwks"}
    with pytest.raises(IdPUnavailable, match="jwks_uri 'http://sso.example.com/jwks' is not https"):
        fetch_jwks(issuer=HTTPS_ISSUER)
    assert calls == [HTTPS_ISSUER + "/.well-known/openid-configuration"]  # the keys were never fetched


def test_fetch_jwks_https_and_loopback_allowed(fake_idp):
    docs, calls = fake_idp
    pub = public_jwks(make_private_jwks(1))
    docs[HTTPS_ISSUER + "/.well-known/openid-configuration"] = {"issuer": HTTPS_ISSUER,
                                                                "jwks_uri": HTTPS_ISSUER + "/certs"}
    docs[HTTPS_ISSUER + "/certs"] = pub
    docs["http://127.0.0.1:8080/certs"] = pub
    assert {k["kid"] for k in fetch_jwks(issuer=HTTPS_ISSUER)["keys"]} == {"rs-1", "es-1"}
    assert {k["kid"] for k in fetch_jwks(jwks_uri="http://127.0.0.1:8080/certs")["keys"]} == {"rs-1", "es-1"}


def test_cli_jwks_refuses_plain_http(fake_idp, tmp_path, capsys):
    _docs, calls = fake_idp
    out = tmp_path / "jwks.json"
    rc = cli.main(["jwks", "--jwks-uri", "http://sso.example.com/jwks", "--slurm", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 5 and "jwks_uri 'http://sso.example.com/jwks' is not https" in err, err
    assert calls == [] and not out.exists()
    rc = cli.main(["jwks", "--issuer", "http://sso.example.com/realms/hpc"])
    assert rc == 5 and "issuer 'http://sso.example.com/realms/hpc' is not https" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ secrets
def test_redact_config_hides_secrets_only(base_conf):
    conf = dict(base_conf, client_id="c", client_secret="s3cr3t", proxy="http://u:pw-123@127.0.0.1:3128")
    parse_config(conf)  # a valid configuration
    red = redact_config(conf)
    assert red["client_secret"] == REDACTED and red["proxy"] == f"http://u:{REDACTED}@127.0.0.1:3128"
    assert {k: v for k, v in red.items() if k not in ("client_secret", "proxy")} == \
        {k: v for k, v in conf.items() if k not in ("client_secret", "proxy")}
    assert conf["client_secret"] == "s3cr3t"  # a copy: the caller's mapping is unchanged
    assert sorted(secret_values(conf)) == ["pw-123", "s3cr3t"]
    assert secret_values(dict(base_conf, proxy="http://127.0.0.1:3128")) == []
    assert redact_config(base_conf) == base_conf


# ------------------------------------------------------------------------------------------------ log file
def test_file_logger_appends_private_file(tmp_path):
    path = tmp_path / "oidc.log"
    log = core.file_logger(str(path), "t")
    log("one")
    log("two")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and lines[0].endswith(f"t[{os.getpid()}]: one") and lines[1].endswith(": two")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_file_logger_refuses_symlink(tmp_path):
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:0\n")
    link = tmp_path / "oidc.log"
    link.symlink_to(victim)
    core.file_logger(str(link))("planted")  # never raises into the login
    assert victim.read_text() == "root:x:0:0\n"
    dangling = tmp_path / "oidc2.log"
    dangling.symlink_to(tmp_path / "created-by-root")
    core.file_logger(str(dangling))("planted")
    assert not (tmp_path / "created-by-root").exists()


def test_file_logger_fd_not_inherited(tmp_path, monkeypatch):
    flags = []
    real_open = os.open

    def spy(path, fl, mode=0o777, **kw):
        flags.append(fl)
        return real_open(path, fl, mode, **kw)

    monkeypatch.setattr(os, "open", spy)
    core.file_logger(str(tmp_path / "oidc.log"))("x")
    assert flags and all(fl & os.O_CLOEXEC and fl & os.O_NOFOLLOW for fl in flags)
