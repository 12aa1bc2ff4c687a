# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""safeyaml.load: hostile YAML is a ValueError, never a hang, a RecursionError or a crashed interpreter.

Found by the fuzz campaign (tests/fuzz) in the NVML replay reader and the scenario loader."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import safeyaml
from support.timing import deadline


def test_plain_yaml_loads():
    assert safeyaml.load("a: [1, {b: c}]\nkmsg: ['[1843.3] NVRM: Xid (PCI:0000:19:00): 79']\n") == {
        "a": [1, {"b": "c"}], "kmsg": ["[1843.3] NVRM: Xid (PCI:0000:19:00): 79"]}


@pytest.mark.parametrize("text", [
    "a: " + "[" * 100000,                      # libyaml's composer: a segmentation fault
    "a: " + "[" * 5000 + "]" * 5000,          # the pure-Python scanner: quadratic, seconds
    "a: " + "{a: " * 3000 + "}" * 3000,
    "a:\n" + "- " * 20000 + "x\n",             # block nesting: RecursionError inside PyYAML
    "a: " + "9" * 5000 + "\n",                 # int() of more than 4300 digits
    "a: [\n",
])
def test_hostile_yaml_is_a_value_error(text):
    with deadline(30), pytest.raises(ValueError, match="^where: not valid YAML"):
        safeyaml.load(text, "where")


def test_flow_depth():
    assert safeyaml.flow_depth("a: [1, [2, {b: [3]}]]") == 4
    assert safeyaml.flow_depth("]]]] [") == 1
    assert safeyaml.flow_depth("") == 0
