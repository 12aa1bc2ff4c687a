"""Regressions found by the fuzz campaign (tests/fuzz) in the Slurm output parsers: minimal inputs."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import (
    SlurmError,
    parse_nodes_json,
    parse_nodes_text,
    parse_version,
)
from support.timing import deadline


def test_errors_not_a_list_is_a_parse_error():
    # was TypeError: 'int' object is not iterable
    with pytest.raises(SlurmError) as exc:
        parse_nodes_json('{"errors": 1, "nodes": []}')
    assert exc.value.kind == "parse"


def test_infinite_number_is_no_number():
    # was OverflowError: cannot convert float infinity to integer (Python's json reads Infinity)
    nodes = parse_nodes_json('{"nodes": [{"name": "gpu01", "state": ["IDLE"], "boot_time": Infinity,'
                             ' "cpus": {"set": true, "infinite": false, "number": -Infinity},'
                             ' "reason_changed_at": 1e999}]}')
    n = nodes["gpu01"]
    assert (n.boot_time, n.cpus, n.reason_time) == (None, None, None)


def test_deeply_nested_json_is_a_parse_error():
    # was RecursionError from the JSON decoder
    with pytest.raises(SlurmError) as exc:
        parse_nodes_json('{"nodes": ' + "[" * 200000 + "]" * 200000 + "}")
    assert exc.value.kind == "parse"


def test_version_of_a_long_digit_run_is_linear():
    # was quadratic backtracking of (\d+)\.(\d+): 16,000 digits took 2 s, this took minutes
    with deadline(30), pytest.raises(SlurmError):
        parse_version("4" * 300000)
    assert parse_version("slurm 24.11.5") == (24, 11, 5)
    assert parse_version("slurm-wlm 22.05.8\n") == (22, 5, 8)
    assert parse_version("slurm 23.02") == (23, 2, 0)


def test_reason_full_of_brackets_is_linear():
    # the Reason regex's lazy prefix backtracked quadratically: 16,000 '[' took a second, this took minutes
    with deadline(30):
        node = parse_nodes_text("NodeName=n1 State=IDLE+DRAIN Reason=" + "[" * 300000)["n1"]
    assert node.reason.startswith("[[[") and node.reason_user == ""
    node = parse_nodes_text("NodeName=n1 State=IDLE+DRAIN Reason=gpufleet: xid79 gpu3 [root@2025-03-01T12:00:00]")["n1"]
    assert (node.reason, node.reason_user) == ("gpufleet: xid79 gpu3", "root")
    assert node.reason_time is not None
