# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Regressions found by the fuzz campaign (tests/fuzz) in the NVML replay reader (fake_nvml configs).

A bad replay file must be a ValueError naming the field, found when the config is read, never a TypeError in
the middle of a probe nor a 2**31-GPU allocation."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import nvml, nvml_fake


@pytest.mark.parametrize("cfg, field", [
    ({"count": 2147483648}, r"fake_nvml\.count"),                           # was: a hang filling memory
    ({"count": 2, "cuda_version": {"x": 1}}, r"fake_nvml\.cuda_version"),    # was: TypeError in int()
    ({"count": 1, "devices": [{"temperature": {"x": 1}}]}, r"fake_nvml\.devices\[0\]\.temperature"),
    ({"count": 1, "devices": [{"power_usage_mw": float("inf")}]}, r"devices\[0\]\.power_usage_mw"),
    ({"count": 2, "devices": [{"index": 1, "fail": {"mode": 8}}]}, r"devices\[0\]\.fail\.mode"),
    ({"count": 1, "devices": [{"retired_pages": {"dbe": 10 ** 12}}]}, r"retired_pages\.dbe"),
    ({"count": 1, "devices": [{"remapped_rows": [0, 4]}]}, r"remapped_rows"),
    ({"count": 1, "devices": [{"nvlinks": 10 ** 9}]}, r"nvlinks"),
    ({"count": 1, "device_defaults": {"name": 7}}, r"device_defaults\.name"),
    ({"count": 1, "devices": [{"clocks_event_reasons": ["gpu_idle", 3]}]}, r"clocks_event_reasons"),
])
def test_bad_values_name_the_field(cfg, field):
    with pytest.raises(ValueError, match=field):
        nvml_fake.FakeNvml(cfg)


def test_non_string_keys_name_the_field():
    # YAML 'on:' is the key True: sorting the unknown keys was a TypeError
    with pytest.raises(ValueError, match="unknown key"):
        nvml_fake.FakeNvml({"count": 1, True: 1, "x": 2})
    with pytest.raises(ValueError, match=r"device_defaults: unknown key"):
        nvml_fake.FakeNvml({"device_defaults": {True: 1, "x": 2}})


@pytest.mark.parametrize("name, text, msg", [
    ("deep.json", '{"count": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply"),
    ("deep.yaml", "count: " + "[" * 100000 + "]" * 100000 + "\n", "nested too deeply|not valid YAML"),
    ("bad.yaml", "count: [\n", "not valid YAML"),
    ("digits.yaml", "count: " + "9" * 5000 + "\n", "Exceeds the limit|not valid YAML"),
])
def test_replay_file_that_cannot_be_read_is_a_value_error(tmp_path, name, text, msg):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=msg):
        nvml_fake.FakeNvml(nvml_fake.load_config(str(path)))


def test_genuine_replay_still_probes():
    snap = nvml.probe(nvml_fake.FakeNvml({"count": 2, "cuda_version": 13000, "devices": [
        {"index": 1, "fail": {"mode": "lost", "after_calls": 3}, "retired_pages": {"sbe": 2, "dbe": 1}},
        {"index": 0, "nvlink_errors": {"0": {"replay": 3}}, "remapped_rows": [0, 4, 1, 0], "temp_slowdown": None}]}))
    assert [g.lost for g in snap.gpus] == [False, True]
    assert snap.cuda_version == "13.0"
