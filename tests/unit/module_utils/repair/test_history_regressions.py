# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Repair history (the node's Slurm field) regressions found by the fuzz campaign (tests/fuzz).

The field is free text anyone with scontrol rights can write: every minimal input below crashed loads() or
dumps() with something other than HistoryError before the fix."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import (
    HistoryError,
    dumps,
    loads,
    loads_ours,
)


@pytest.mark.parametrize("text", [
    '{"gf":1,"n":Infinity}',                                   # was OverflowError in _int
    '{"gf":1,"cd":1e999}',
    '{"gf":1,"i":{"c":"nl","id":Infinity,"s":[],"t":0}}',
    '{"gf":1,"i":{"c":"nl","id":2,"s":[],"sp":{},"t":0}}',     # was TypeError (unhashable) in dumps()
    '{"gf":1,"i":{"c":"nl","id":2,"s":[],"k":[1],"t":0}}',
    '{"gf":1,"n":' + "[" * 100000 + "]" * 100000 + "}",        # was RecursionError from the decoder
])
def test_hostile_history_is_a_history_error(text):
    with pytest.raises(HistoryError):
        dumps(loads(text))
    with pytest.raises(HistoryError):
        h = loads_ours(text)
        dumps(h)


def test_genuine_history_round_trips():
    text = '{"gf":1,"i":{"c":"nl","id":2,"k":"xid74","s":[["b",1760000000,null]],"sp":"spare-7","t":1759990000},"n":2}'
    assert dumps(loads(text)) == text
