# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one atomic-write helper: mode handling, directories, and nothing half-written on failure."""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import fileutil
from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_text_and_bytes_with_modes(tmp_path):
    p = tmp_path / "a.json"
    atomic_write(p, "caf\u00e9\r\n", 0o600)
    assert p.read_bytes() == "caf\u00e9\r\n".encode() and _mode(p) == 0o600
    atomic_write(str(p), b"\x00\xff", 0o640)
    assert p.read_bytes() == b"\x00\xff" and _mode(p) == 0o640


def test_mode_none_keeps_the_old_mode_and_defaults_to_0644(tmp_path):
    p = tmp_path / "slurm.conf"
    atomic_write(p, "A=1\n", None)
    assert _mode(p) == 0o644
    os.chmod(p, 0o600)
    atomic_write(p, "A=2\n", None, keep_owner=True)
    assert _mode(p) == 0o600 and p.read_text() == "A=2\n"


def test_makedirs(tmp_path):
    p = tmp_path / "x" / "y" / "state.json"
    with pytest.raises(FileNotFoundError):
        atomic_write(p, "{}")
    atomic_write(p, "{}", makedirs=True)
    assert p.read_text() == "{}"


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    p = tmp_path / "keep.txt"
    p.write_text("old\n")

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileutil.os, "fsync", boom)
    with pytest.raises(OSError, match="No space"):
        atomic_write(p, "new\n")
    assert p.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]
