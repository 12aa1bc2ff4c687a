# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kmsg adapter: the real /dev/kmsg read without blocking, the (boot_id, seq) cursor, captured files."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils import kmsg


def test_boot_identity():
    assert kmsg.boot_id() and len(kmsg.boot_id()) == 36
    assert kmsg.boot_time() > 1e9


def test_dev_kmsg_cursor():
    records, cursor = kmsg.read_dev_kmsg()
    assert records and all(r.split(",", 3)[1].isdigit() for r in records)
    assert cursor["boot_id"] == kmsg.boot_id() and cursor["seq"] == int(records[-1].split(",")[1])
    again, cursor2 = kmsg.read_dev_kmsg(cursor=cursor)
    assert all(int(r.split(",")[1]) > cursor["seq"] for r in again)
    assert cursor2["seq"] >= cursor["seq"]
    # a cursor from another boot reads the whole buffer again
    other, _other_cursor = kmsg.read_dev_kmsg(cursor={"boot_id": "another-boot", "seq": 10 ** 9})
    assert len(other) >= len(records)
    events, _live_cursor = kmsg.live_events()
    assert isinstance(events, list)


def test_captured_file(tmp_path):
    p = tmp_path / "k.log"
    p.write_bytes(b"[ 1.0] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n\xff\n")
    assert "Xid" in kmsg.read_kmsg_file(str(p))
    with pytest.raises(ValueError, match="byte limit"):
        kmsg.read_kmsg_file(str(p), max_bytes=5)
    with pytest.raises(OSError):
        kmsg.read_kmsg_file(str(tmp_path / "missing.log"))
