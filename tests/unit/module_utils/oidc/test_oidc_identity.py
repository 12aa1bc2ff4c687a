"""Identity mapping an attacker cannot bend: look-alike names, foreign domains, system accounts; config errors that
never print secrets."""
from __future__ import annotations

import pwd

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import oidc as cli
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import load_config, parse_config
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import ConfigError, NotAuthorised
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.policy import map_user

#: IdP user names that are *other* identities but look like (or fold onto) an ASCII local name.
LOOK_ALIKES = [
    "sec\u212aate",  # KELVIN SIGN: "sec\u212aate".lower() == "seckate"
    "SEC\u212aATE",
    "\u017feckate",  # LATIN SMALL LETTER LONG S: casefold -> "s"
    "sec\ufb00",  # LATIN SMALL LIGATURE FF: casefold/NFKC -> "ff"
    "\uff53\uff45\uff43\uff4b\uff41\uff54\uff45",  # full-width "seckate": NFKC -> "seckate"
    "s\u0435ckate",  # CYRILLIC SMALL LETTER IE
    "seckate\u200b",  # ZERO WIDTH SPACE
    "seck\u0430te",  # CYRILLIC SMALL LETTER A
    "seckate\u0000",
    "sec kate",
]


@pytest.mark.parametrize("name", LOOK_ALIKES)
def test_look_alike_names_refused_before_folding(make_cfg, name):
    for cfg in (make_cfg(), make_cfg(username_lowercase=False, username_regex=r"^\w+$"),
                make_cfg(allowed_domains=["corp.example"])):
        with pytest.raises(NotAuthorised, match="not plain ASCII"):
            map_user(cfg, {"preferred_username": name})
        with pytest.raises(NotAuthorised, match="not plain ASCII"):
            map_user(cfg, {"preferred_username": name + "@corp.example"})


@pytest.mark.parametrize("name", ["seckate", "SecKate", "SECKATE", "seckate@corp.example", "SecKate@CORP.Example"])
def test_genuine_names_still_fold_a_to_z(make_cfg, name):
    assert map_user(make_cfg(allowed_domains=["corp.example"]), {"preferred_username": name}) == "seckate"


def test_user_map_keys_follow_the_same_rule(base_conf, make_cfg):
    for bad in ({"sec\u212aate": "seckate"}, {"alice": "sec\u212aate"}, {"\uff41lice": "alice"}):
        with pytest.raises(ConfigError, match="plain printable ASCII") as ei:
            parse_config(dict(base_conf, user_map=bad))
        assert ei.value.key == "user_map"
    cfg = make_cfg(user_map={"Kate.Smith": "seckate"})
    assert map_user(cfg, {"preferred_username": "kate.smith"}) == "seckate"
    with pytest.raises(NotAuthorised, match="not plain ASCII"):
        map_user(cfg, {"preferred_username": "\u212aate.Smith"})


# ------------------------------------------------------------------------------------------------ domains
@pytest.mark.parametrize("preset", ["okta", "entra"])
def test_domain_presets_strip_only_allowed_domains(make_cfg, base_conf, preset):
    with pytest.raises(ConfigError, match="list the domains") as ei:
        parse_config(dict(base_conf, preset=preset))
    assert ei.value.key == "allowed_domains"
    cfg = make_cfg(preset=preset, allowed_domains=["corp.example"])
    assert map_user(cfg, {"preferred_username": "Alice@Corp.Example"}) == "alice"
    assert map_user(cfg, {"preferred_username": "alice"}) == "alice"  # no domain: nothing to strip
    for other in ("alice@evil.example", "alice@corp.example.evil.example", "alice@sub.corp.example",
                  "alice@evil.example@corp.example.x"):
        with pytest.raises(NotAuthorised, match="not in allowed_domains"):
            map_user(cfg, {"preferred_username": other})
    # allowed_domains: [] says names carry no domain: a user@domain name then fails username_regex
    cfg = make_cfg(preset=preset, allowed_domains=[])
    with pytest.raises(NotAuthorised, match="username_regex"):
        map_user(cfg, {"preferred_username": "alice@evil.example"})


@pytest.mark.parametrize("key", ["allowed_domains", "username_strip_domains"])
@pytest.mark.parametrize("value", [["*"], "*", ["corp.example", "*"], ["k\u212a.example"], ["a@b"]])
def test_any_domain_wildcard_refused(base_conf, key, value):
    with pytest.raises(ConfigError, match="expected domain names") as ei:
        parse_config(dict(base_conf, **{key: value}))
    assert ei.value.key == key


def test_old_key_name_still_works(make_cfg, base_conf):
    cfg = make_cfg(username_strip_domains=["corp.example"])
    assert cfg.allowed_domains == ["corp.example"]
    with pytest.raises(NotAuthorised, match="not in allowed_domains"):
        map_user(cfg, {"preferred_username": "bob@evil.example"})
    with pytest.raises(ConfigError, match="set only allowed_domains"):
        parse_config(dict(base_conf, username_strip_domains=["a.example"], allowed_domains=["a.example"]))


# ------------------------------------------------------------------------------------------------ system accounts
@pytest.mark.parametrize("name", ["daemon", "bin", "sys", "nobody"])
def test_system_accounts_denied(make_cfg, name):
    uid = pwd.getpwnam(name).pw_uid  # every Debian system has these (a missing one is a broken test host)
    with pytest.raises(NotAuthorised, match="system account") as ei:
        map_user(make_cfg(), {"preferred_username": name})
    assert f"uid {uid}" in ei.value.reason
    # control: the refusal is the uid range, which a site can move
    assert map_user(make_cfg(min_uid=1, max_uid=65534), {"preferred_username": name}) == name


def test_uid0_and_unknown_users(make_cfg):
    with pytest.raises(NotAuthorised, match="denied"):
        map_user(make_cfg(min_uid=1, max_uid=65534, user_map={"alice": "root"}), {"preferred_username": "alice"})
    assert map_user(make_cfg(), {"preferred_username": "nosuchuser-gpufleet"}) == "nosuchuser-gpufleet"


@pytest.mark.parametrize("over,key", [({"min_uid": 0}, "min_uid"), ({"min_uid": "1000"}, "min_uid"),
                                      ({"max_uid": 500}, "max_uid"), ({"max_uid": True}, "max_uid")])
def test_uid_range_config(base_conf, over, key):
    with pytest.raises(ConfigError) as ei:
        parse_config(dict(base_conf, **over))
    assert ei.value.key == key


# ------------------------------------------------------------------------------------------------ secrets in errors
SECRET = "s3cr3t-Zq9"


@pytest.mark.parametrize("over", [
    {"client_secret": 918273645},
    {"client_secret": ["s3cr3t-Zq9"]},
    {"client_secret": {"value": SECRET}},
    {"proxy": f"http://user:{SECRET}@proxy.example:3128/path"},
    {"proxy": f"socks5://user:{SECRET}@proxy.example:1080"},
    {"proxy": f"http://user:{SECRET}@proxy example:3128"},
    {"proxy": 3128},
])
def test_config_errors_never_print_secrets(base_conf, tmp_path, capsys, over):
    with pytest.raises(ConfigError) as ei:
        parse_config(dict(base_conf, **over))
    assert ei.value.key in over
    for shown in (str(ei.value), ei.value.reason):
        assert SECRET not in shown and "918273645" not in shown, shown
    # through the CLI, as a login node's operator sees it
    p = tmp_path / "oidc.yml"
    p.write_text(yaml.safe_dump(dict(base_conf, **over)))
    rc = cli.main(["validate", "--config", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and f"config key '{ei.value.key}'" in err
    assert SECRET not in err and "918273645" not in err, err


def test_yaml_error_shows_position_not_content(base_conf, tmp_path):
    p = tmp_path / "oidc.yml"
    p.write_text(yaml.safe_dump(base_conf) + f'client_secret: "{SECRET}\\q"\n')
    with pytest.raises(ConfigError, match=r"not valid YAML \(line \d+, column \d+\)") as ei:
        load_config(str(p))
    assert "q'" not in str(ei.value) and SECRET not in str(ei.value)


# ------------------------------------------------------------------------------------------------ property


#: the most permissive settings (any regex, any uid but 0): only the ASCII rule stands between a name and a user
_PERMISSIVE = parse_config({"issuer": "http://127.0.0.1:9", "audience": "a", "username_claim": "preferred_username",
                            "groups_claim": "groups", "allowed_groups": ["g"], "jwks_cache_dir": "/nonexistent",
                            "username_regex": r"^.+$", "min_uid": 1, "max_uid": 2 ** 32 - 1})


@settings(max_examples=3000, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_only_plain_ascii_names_ever_map(name):
    """Whatever the IdP sends, a mapped name comes from a plain-ASCII claim by folding A-Z only."""
    cfg = _PERMISSIVE
    try:
        user = map_user(cfg, {"preferred_username": name})
    except NotAuthorised:
        return
    assert name.isascii() and name.isprintable() and " " not in name
    assert user == "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in name)
