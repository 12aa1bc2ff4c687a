# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/diff.py: the diff entries every module returns, in the shape Ansible's diff mode prints."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.diff import change, file_changes


def test_change_has_the_four_keys_ansible_reads():
    assert change("/etc/x", "a\n", "b\n") == {"before_header": "/etc/x", "after_header": "/etc/x",
                                              "before": "a\n", "after": "b\n"}


def test_absent_is_empty_text_bytes_are_decoded_and_mappings_stay_mappings():
    assert change("f", None, b"caf\xc3\xa9\n")["before"] == ""
    assert change("f", None, b"caf\xc3\xa9\n")["after"] == "caf\u00e9\n"
    # undecodable bytes are shown replaced (a lone surrogate would not survive the JSON to the controller)
    assert change("f", b"\xff\xfe", None)["before"] == "\ufffd\ufffd"
    entry = change("nodes gpu01", {"gpu01": {"state": "idle"}}, {"gpu01": {"state": "drain"}})
    assert entry["before"] == {"gpu01": {"state": "idle"}} and isinstance(entry["after"], dict)


@pytest.mark.parametrize("bad", [["a"], 3, ("x",)])
def test_other_sides_are_refused(bad):
    # Ansible would crash printing a list (it formats mappings only): refuse it where the module builds it
    with pytest.raises(TypeError, match="a side is text, bytes, a mapping or None"):
        change("f", bad, "")


def test_file_changes_nothing_when_nothing_changes():
    assert file_changes("/f", "x\n", "x\n", 0o644, 0o100644) == []
    assert file_changes("/f", None, None) == []


def test_file_changes_content_and_mode():
    assert file_changes("/f", None, "x\n", None, 0o600) == [change("/f", "", "x\n")]  # created: content only
    assert file_changes("/f", "x\n", None, 0o600, None) == [change("/f", "x\n", "")]  # removed
    assert file_changes("/f", "x\n", "x\n", 0o100644, 0o600) == [change("/f (mode)", "0644\n", "0600\n")]
    assert file_changes("/f", "x\n", "y\n", 0o644, 0o755) == [change("/f", "x\n", "y\n"),
                                                              change("/f (mode)", "0644\n", "0755\n")]


def test_file_changes_compares_bytes_not_their_display():
    # both display as U+FFFD, yet the file changes: the entry must be there
    assert len(file_changes("/f", b"\xff", b"\xfe")) == 1


def test_file_changes_shown_hides_but_still_reports_a_hidden_change():
    def shown(text):
        return "secret: ***\n"
    entries = file_changes("/f", "secret: a\n", "secret: b\n", shown=shown)
    assert entries == [change("/f", "secret: ***\n", "secret: ***\n")]
    assert file_changes("/f", None, "secret: b\n", shown=shown) == [change("/f", "", "secret: ***\n")]
    assert file_changes("/f", "secret: a\n", "secret: a\n", shown=shown) == []
