# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one validator every configuration reader uses: each check with a genuine value, and each refusal naming the
field, what was expected and what it got (a secret's value never shown; a huge integer never repr()'d)."""

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import spec


class Mine(Exception):
    pass


def test_genuine_values_pass_through():
    assert spec.mapping(None, "x") == {} and spec.mapping({"a": 1}, "x", ["a"]) == {"a": 1}
    assert spec.integer(3, "x", 1, 5) == 3 and spec.number(2, "x", 0) == 2.0 and spec.boolean(False, "x") is False
    assert spec.string("a", "x") == "a" and spec.string("", "x", empty_ok=True) == ""
    assert spec.choice("b", "x", ("a", "b")) == "b" and spec.string_list("a", "x", scalar_ok=True) == ["a"]
    assert spec.sequence([1], "x") == [1]


@pytest.mark.parametrize("call, message", [
    (lambda: spec.mapping([1], "jobs"), "jobs: expected a mapping, got list"),
    (lambda: spec.mapping({"a": 1, True: 2, "z": 3}, "cfg", ["a"]), "cfg: unknown key(s) True, z; expected some of a"),
    (lambda: spec.integer(True, "budget.attempts", 1), "budget.attempts: expected an integer >= 1, got True"),
    (lambda: spec.integer(0, "retries", 1, 9), "retries: expected an integer from 1 to 9, got 0"),
    (lambda: spec.integer("3", "n"), "n: expected an integer, got '3'"),
    (lambda: spec.number(float("nan"), "rate"), "rate: expected a finite number, got nan"),
    (lambda: spec.number(-1, "rate", 0), "rate: expected a number >= 0, got -1"),
    (lambda: spec.number(16 ** 4000, "rate"), "rate: expected a finite number, got an integer of 16001 bits"),
    (lambda: spec.integer("9" * 5000, "n"), "n: expected an integer, got '999999"),
    (lambda: spec.boolean("yes", "breaker.enabled"), "breaker.enabled: expected true or false, got 'yes'"),
    (lambda: spec.string(" ", "issuer"), "issuer: expected a non-empty string, got str ' '"),
    (lambda: spec.string(5, "client_secret", shown=False), "client_secret: expected a non-empty string, got int "
                                                           "(value not shown)"),
    (lambda: spec.choice("x", "phase", ("boot", "once")), "phase: expected one of boot, once, got 'x'"),
    (lambda: spec.string_list(["a", ""], "groups"), "groups: expected a list of non-empty strings, got ['a', '']"),
    (lambda: spec.string_list([], "groups", empty_ok=False), "groups: expected at least one entry"),
    (lambda: spec.sequence({}, "faults"), "faults: expected a list, got dict"),
])
def test_each_refusal_names_the_field_and_what_was_expected(call, message):
    with pytest.raises(spec.SpecError) as e:
        call()
    assert str(e.value).startswith(message), str(e.value)
    assert len(str(e.value)) <= 320


def test_a_reader_keeps_its_own_exception_type():
    with pytest.raises(Mine, match=r"^ttl: expected an integer >= 0, got -1$"):
        spec.integer(-1, "ttl", 0, fail=spec.raising(Mine))
    seen = []

    def two_args(key, reason):  # the OIDC ConfigError takes the key and the reason
        seen.append((key, reason))
        return Mine(reason)

    with pytest.raises(Mine):
        spec.boolean(1, "verify_tls", fail=two_args)
    assert seen == [("verify_tls", "expected true or false, got 1")]


def test_the_readers_use_it():
    """Every configuration reader checks its fields through this module (a rule lives once)."""
    from pathlib import Path

    root = Path(spec.__file__).resolve().parents[2]
    readers = ["plugins/module_utils/repair/config.py", "plugins/module_utils/health/config.py",
               "plugins/module_utils/oidc/config.py", "plugins/module_utils/startup/scripts.py",
               "simulator/gpufleet_sim/scenario.py", "simulator/gpufleet_sim/policies.py"]
    for rel in readers:
        text = (root / rel).read_text()
        assert "spec." in text or "checks." in text, rel
        assert "expected true or false, got" not in text, f"{rel} writes its own boolean check"
