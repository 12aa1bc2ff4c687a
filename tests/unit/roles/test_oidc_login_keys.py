# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The oidc_login role describes the OIDC configuration's keys (argument spec) and names the missing ones itself
(vars/main.yml): both must say what plugins/module_utils/oidc/config.py accepts, or a valid configuration would be
refused by the argument spec, or a missing key only found by oidc_pam one at a time."""
from pathlib import Path

import yaml

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import config

ROLE = Path(__file__).resolve().parents[3] / "roles" / "oidc_login"


def _spec_options():
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]["oidc_login_config"]["options"]


def test_argument_spec_lists_exactly_the_keys_the_config_accepts():
    accepted = set(config.OIDCConfig.__dataclass_fields__) - {"audiences"} | {"audience", "username_strip_domains"}
    assert set(_spec_options()) == accepted


def test_secrets_are_no_log_and_nothing_is_required_in_the_spec():
    options = _spec_options()
    assert {k for k, o in options.items() if o.get("no_log")} >= set(config.SECRET_KEYS) | {"proxy"}
    # required keys are checked by the role's first task, all at once and preset-aware (a spec `required` would
    # refuse a preset that supplies the claims)
    assert not [k for k, o in options.items() if o.get("required")]
    assert set(options["preset"]["choices"]) == set(config.PRESETS)


def test_role_required_and_preset_lists_match_the_config():
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert tuple(role_vars["oidc_login_required_keys"]) == config._REQUIRED
    for preset, supplied in role_vars["oidc_login_preset_keys"].items():
        assert set(supplied) == set(config.PRESETS[preset]) & set(config._REQUIRED), preset
    assert set(role_vars["oidc_login_preset_keys"]) == set(config.PRESETS)
    assert tuple(role_vars["oidc_login_domain_presets"]) == config.DOMAIN_PRESETS
