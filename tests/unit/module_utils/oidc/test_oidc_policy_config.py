"""Config validation (errors name the key), presets, user mapping and the group gate."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import PRESETS, load_config, parse_config
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import ConfigError, NotAuthorised
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.policy import authorise, map_user


@pytest.mark.parametrize("key", ["issuer", "audience", "username_claim", "groups_claim", "allowed_groups",
                                 "jwks_cache_dir"])
def test_required_keys_named(base_conf, key):
    d = dict(base_conf)
    del d[key]
    with pytest.raises(ConfigError) as ei:
        parse_config(d)
    assert ei.value.key == key and f"'{key}'" in str(ei.value)


@pytest.mark.parametrize("key,value,msg", [
    ("algorithms", ["RS256", "HS256"], "only asymmetric"),
    ("algorithms", ["none"], "only asymmetric"),
    ("issuer", "http://idp.example.com", "plain http"),
    ("audience", 3, "list of non-empty strings"),
    ("allowed_groups", [], "at least one"),
    ("leeway", -1, "integer"),
    ("leeway", 3600, "300 seconds"),
    ("groups_match", "some", "'any' or 'all'"),
    ("username_regex", "([", "regular expression"),
    ("jwks_cache_dir", "relative/dir", "absolute"),
    ("allowed_group", ["x"], "unknown setting"),
    ("preset", "auth0", "expected one of"),
    ("user_map", {"a": 1}, "mapping"),
])
def test_bad_values_named(base_conf, key, value, msg):
    d = dict(base_conf, **{key: value})
    with pytest.raises(ConfigError) as ei:
        parse_config(d)
    assert ei.value.key == key
    assert msg in str(ei.value)


def test_load_yaml_file(tmp_path, base_conf):
    import yaml

    p = tmp_path / "oidc.yml"
    p.write_text(yaml.safe_dump(dict(base_conf, preset="entra", allowed_domains=["contoso.example"])))
    cfg = load_config(str(p))
    assert cfg.groups_claim == "groups"  # explicit key beats the preset's "roles"
    assert cfg.allowed_domains == ["contoso.example"] and cfg.username_claim == "preferred_username"
    assert cfg.denied_users == ["root"]
    (tmp_path / "bad.yml").write_text("issuer: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(tmp_path / "bad.yml"))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_load(base_conf, preset):
    d = {k: v for k, v in base_conf.items() if k not in ("username_claim", "groups_claim")}
    cfg = parse_config(dict(d, preset=preset, allowed_domains=["corp.example"]))
    assert cfg.username_claim and cfg.groups_claim
    assert set(cfg.algorithms) <= {"RS256", "ES256", "PS256"}


def test_entra_roles_gate(make_cfg):
    base = {k: None for k in ()}
    cfg = make_cfg(preset="entra", groups_claim="roles", allowed_groups=["Cluster.User"],
                   allowed_domains=["contoso.onmicrosoft.com"], **base)
    claims = {"preferred_username": "Alice.Smith@Contoso.onmicrosoft.com", "roles": ["Cluster.User"],
              "groups": ["6f0e9a3c-5d1b-4a8e-9c2f-0b1d2e3f4a5b"]}
    assert authorise(cfg, claims) == "alice.smith"


@pytest.mark.parametrize("over,claims,expected", [
    ({}, {"preferred_username": "Alice"}, "alice"),
    ({"username_lowercase": False, "username_regex": "^[A-Za-z]+$"}, {"preferred_username": "Alice"}, "Alice"),
    ({"username_strip_domains": ["corp.example"]}, {"preferred_username": "bob@CORP.example"}, "bob"),
    ({"username_claim": "email", "allowed_domains": ["x.test"]}, {"email": "carol@X.Test"}, "carol"),
    ({"user_map": {"Dave@Corp.Example": "dsmith"}, "username_strip_domains": ["corp.example"]},
     {"preferred_username": "dave@corp.example"}, "dsmith"),
])
def test_user_mapping(make_cfg, over, claims, expected):
    assert map_user(make_cfg(**over), claims) == expected


@pytest.mark.parametrize("over,claims,msg", [
    ({}, {"preferred_username": "root"}, "denied"),
    ({"allowed_domains": ["corp.example"]}, {"preferred_username": "root@corp.example"}, "denied"),
    ({"user_map": {"alice": "root"}}, {"preferred_username": "alice"}, "denied"),
    ({"denied_users": ["mallory"]}, {"preferred_username": "mallory"}, "denied"),
    ({}, {"preferred_username": "bob@corp.example"}, "username_regex"),
    ({}, {"preferred_username": "../etc"}, "username_regex"),
    ({}, {"preferred_username": 5}, "missing or not a string"),
    ({}, {}, "missing or not a string"),
    ({"require_local_user": True}, {"preferred_username": "nosuchuser-gpufleet"}, "no local account"),
])
def test_user_mapping_refusals(make_cfg, over, claims, msg):
    with pytest.raises(NotAuthorised, match=msg):
        map_user(make_cfg(**over), claims)


@pytest.mark.parametrize("over,groups,ok", [
    ({}, ["hpc-users"], True),
    ({}, "hpc-users", True),
    ({}, ["students"], False),
    ({}, None, False),
    ({"allowed_groups": ["hpc-users", "gpu"], "groups_match": "all"}, ["hpc-users"], False),
    ({"allowed_groups": ["hpc-users", "gpu"], "groups_match": "all"}, ["gpu", "hpc-users", "x"], True),
    ({"allowed_groups": ["hpc-users", "gpu"]}, ["gpu"], True),
    ({"denied_groups": ["suspended"]}, ["hpc-users", "suspended"], False),
    # a denial is case-blind: an IdP spelling the group otherwise must not let a denied user in
    ({"denied_groups": ["suspended"]}, ["hpc-users", "Suspended"], False),
    ({"denied_groups": ["Contractors"]}, ["hpc-users", "CONTRACTORS"], False),
    ({"denied_groups": ["suspended"]}, ["hpc-users", "suspended-not"], True),
    # an allowance is exact: a look-alike group never grants access
    ({}, ["HPC-Users"], False),
])
def test_group_gate(make_cfg, over, groups, ok):
    claims = {"preferred_username": "alice", "groups": groups}
    cfg = make_cfg(**over)
    if ok:
        assert authorise(cfg, claims) == "alice"
    else:
        with pytest.raises(NotAuthorised):
            authorise(cfg, claims)


def test_login_user_must_match(make_cfg):
    with pytest.raises(NotAuthorised, match="!= login user"):
        authorise(make_cfg(), {"preferred_username": "alice", "groups": ["hpc-users"]}, "bob")


@pytest.mark.parametrize("text", ["issuer: " + "[" * 5000 + "]" * 5000,
                                  "issuer:\n" + "".join(" " * i + "- \n" for i in range(1, 3000)),
                                  "issuer: " + "9" * 5000 + "\n",
                                  "issuer: [unclosed client_secret: s3cr3t-value\n"])
def test_hostile_config_is_a_config_error_without_the_text(tmp_path, text):
    """Deep flow or block nesting, a huge integer and broken YAML: a ConfigError that quotes nothing of the file."""
    p = tmp_path / "oidc.yml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="not valid YAML") as ei:
        load_config(str(p))
    assert "s3cr3t" not in str(ei.value) and "999" not in str(ei.value)
