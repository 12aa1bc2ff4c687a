"""The on-disk JWKS cache (permissions, atomic writes, stale use, fail closed) and the CLI."""
from __future__ import annotations

import io
import json
import os
import stat

import pytest
import yaml

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import oidc as cli
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import ConfigError, IdPUnavailable
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import JWKSCache
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.slurm import normalise_jwks_for_slurm
from support.oidc_forge import AUD, ISSUER, claims_for, make_private_jwks, public_jwks, sign


def test_cache_file_is_private_and_atomic(seeded):
    cfg, cache = seeded()
    st = os.stat(cfg.jwks_cache_dir)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache.path).st_mode) == 0o600
    leftovers = [n for n in os.listdir(cfg.jwks_cache_dir) if n.startswith(".tmp-")]
    assert leftovers == []
    with open(cache.path) as fh:
        data = json.load(fh)
    assert {k["kid"] for k in data["keys"]} == {"rs-1", "es-1"}
    assert all("d" not in k for k in data["keys"])  # never private parts


def test_group_writable_cache_dir_refused(make_cfg, private_jwks, tmp_path):
    cfg = make_cfg()
    os.makedirs(cfg.jwks_cache_dir)
    os.chmod(cfg.jwks_cache_dir, 0o777)
    with pytest.raises(ConfigError, match="writable by group or others"):
        JWKSCache.from_config(cfg).seed(public_jwks(private_jwks))


def test_stale_cache_used_within_max_stale_then_fail_closed(seeded):
    cfg, cache = seeded(jwks_ttl=60, max_stale=3600)
    t0 = cache.state["jwks_fetched_at"]
    later = JWKSCache.from_config(cfg)
    later.clock = lambda: t0 + 1800  # stale, IdP (127.0.0.1:9) unreachable, inside max_stale
    assert later.find_key("rs-1", "RS256")["kid"] == "rs-1"
    assert later.fetches == 1
    much_later = JWKSCache.from_config(cfg)
    much_later.clock = lambda: t0 + 60 + 3600 + 1
    with pytest.raises(IdPUnavailable, match="no usable signing keys"):
        much_later.find_key("rs-1", "RS256")


def test_no_cache_fail_closed(make_cfg):
    with pytest.raises(IdPUnavailable):
        JWKSCache.from_config(make_cfg()).find_key("rs-1", "RS256")


def test_tampered_cache_file_ignored(seeded):
    cfg, cache = seeded()
    os.chmod(cache.path, 0o644)  # someone loosened it: do not trust it
    with pytest.raises(IdPUnavailable):
        JWKSCache.from_config(cfg).find_key("rs-1", "RS256")


def _cfgfile(tmp_path, base_conf):
    p = tmp_path / "oidc.yml"
    p.write_text(yaml.safe_dump(base_conf))
    return str(p)


def _run(monkeypatch, capsys, argv, stdin):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_validate(tmp_path, base_conf, seeded, private_jwks, monkeypatch, capsys):
    seeded()
    path = _cfgfile(tmp_path, base_conf)
    good = sign(private_jwks, claims_for(ISSUER, AUD, user="alice"))
    rc, out, err = _run(monkeypatch, capsys, ["validate", "--config", path], good + "\n")
    assert (rc, out.strip()) == (0, "alice"), err
    rc, out, err = _run(monkeypatch, capsys, ["validate", "--config", path, "--user", "bob"], good)
    assert rc == 4 and out == "" and "!= login user" in err
    rc, out, err = _run(monkeypatch, capsys, ["validate", "--config", path],
                        sign(private_jwks, claims_for(ISSUER, "urn:x")))
    assert rc == 3 and out == "" and "invalid claim: aud" in err
    rc, out, err = _run(monkeypatch, capsys, ["validate", "--config", path],
                        sign(private_jwks, claims_for(ISSUER, AUD, groups=["students"])))
    assert rc == 4 and "not in any allowed group" in err


def test_cli_config_error_names_key(tmp_path, base_conf, monkeypatch, capsys):
    path = _cfgfile(tmp_path, dict(base_conf, algorithms=["HS256"]))
    rc, out, err = _run(monkeypatch, capsys, ["validate", "--config", path], "x")
    assert rc == 2 and "'algorithms'" in err and out == ""


def test_cli_no_cache_idp_down(tmp_path, base_conf, private_jwks, monkeypatch, capsys):
    path = _cfgfile(tmp_path, base_conf)
    rc, out, err = _run(monkeypatch, capsys, ["validate", "--config", path],
                        sign(private_jwks, claims_for(ISSUER, AUD)))
    assert rc == 5 and out == "" and "no usable signing keys" in err


def test_slurm_normalisation(private_jwks):
    pub = public_jwks(private_jwks)
    for k in pub["keys"]:
        k.pop("alg", None)  # like Entra
        k["x5c"] = ["MIIC..."]
    out = normalise_jwks_for_slurm(pub)
    assert [k["kid"] for k in out["keys"]] == ["rs-1"]
    assert out["keys"][0]["alg"] == "RS256" and "x5c" not in out["keys"][0]


def test_outage_one_attempt_per_interval(seeded):
    """While the IdP is down, only the first login after min_refresh_interval waits on a refresh attempt."""
    cfg, cache = seeded(jwks_ttl=60, max_stale=3600, min_refresh_interval=30)
    t0 = cache.state["jwks_fetched_at"]
    first = JWKSCache.from_config(cfg)
    first.clock = lambda: t0 + 600
    assert first.find_key("rs-1", "RS256") and first.fetches == 1
    second = JWKSCache.from_config(cfg)
    second.clock = lambda: t0 + 610  # 10 s later: the attempt stamped in the shared file is recent
    assert second.find_key("rs-1", "RS256") and second.fetches == 0
    third = JWKSCache.from_config(cfg)
    third.clock = lambda: t0 + 640
    assert third.find_key("rs-1", "RS256") and third.fetches == 1


def test_discovered_plain_http_jwks_uri_refused(make_cfg, private_jwks):
    cfg = make_cfg(min_refresh_interval=0)
    lines = []
    cache = JWKSCache.from_config(cfg, log=lines.append)
    cache.seed(public_jwks(private_jwks), metadata={"issuer": ISSUER, "jwks_uri": "http://idp.example.com/jwks"})
    with pytest.raises(Exception, match="unknown signing key"):
        from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import TokenValidator

        TokenValidator(cfg, cache).validate(sign(make_private_jwks(2), claims_for(ISSUER, AUD), "rs-2"))
    assert any("is not https" in line for line in lines), lines
    assert cache.fetches == 0


def test_device_prompt_strips_control_characters():
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.pam import device_prompt

    p = device_prompt("alice", {"verification_uri": "https://idp/device\x1b[2J\rfake: ", "user_code": "AB\x07CD"})
    assert "\x1b" not in p and "\r" not in p and "\x07" not in p
    assert p.startswith("To log in as alice, open https://idp/devicefake: ") and "code ABCD." in p  # ESC [2J whole
    assert p.endswith("Press Enter here after you have approved: ")


def test_proxy_setting_validated(base_conf):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import parse_config

    assert parse_config(dict(base_conf, proxy="http://proxy.corp:3128")).proxy == "http://proxy.corp:3128"
    with pytest.raises(ConfigError) as ei:
        parse_config(dict(base_conf, proxy="proxy.corp:3128"))
    assert ei.value.key == "proxy"
