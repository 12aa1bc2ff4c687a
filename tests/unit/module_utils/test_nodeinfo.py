# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node-level telemetry: the real /proc of this machine, and an InfiniBand sysfs tree shaped like mlx5's."""
from __future__ import annotations

from ansible_collections.gpufleet.reliability.plugins.module_utils import nodeinfo
from ansible_collections.gpufleet.reliability.plugins.module_utils.health import Snapshot, judge


def test_this_machine(tmp_path):
    snap = nodeinfo.fill(Snapshot(), disk_paths=[str(tmp_path), "/does/not/exist"])
    assert any(m.path == "/" for m in snap.mounts)
    assert [d.path for d in snap.disks] == [str(tmp_path)] and snap.disks[0].total_bytes > 0
    assert snap.memory_total_bytes > snap.memory_available_bytes > 0
    assert snap.boot_id
    r = judge(snap, [], config={"required_mounts": ["/"]}, now=0)
    assert r.verdict == "healthy", r.summary
    r = judge(snap, [], config={"required_mounts": ["/scratch-gpufleet-missing"]}, now=0)
    assert (r.verdict, r.code, r.action) == ("unhealthy", "mount_missing", "reboot")


def test_ib_ports(tmp_path):
    for hca, port, state, rate in (("mlx5_0", "1", "4: ACTIVE", "400 Gb/sec (4X NDR)"),
                                   ("mlx5_1", "1", "1: DOWN", "10 Gb/sec (4X SDR)")):
        d = tmp_path / hca / "ports" / port
        d.mkdir(parents=True)
        (d / "state").write_text(state + "\n")
        (d / "phys_state").write_text("5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
        (d / "rate").write_text(rate + "\n")
        (d / "link_layer").write_text("InfiniBand\n")
    ports = nodeinfo.ib_ports(str(tmp_path))
    assert [(p.name, p.state, p.rate_gbps) for p in ports] == [("mlx5_0/1", "ACTIVE", 400.0),
                                                               ("mlx5_1/1", "DOWN", 10.0)]
    r = judge(Snapshot(ib_ports=ports), [], now=0)
    assert (r.verdict, r.code) == ("unhealthy", "ib_down")
    r = judge(Snapshot(ib_ports=ports[:1]), [], config={"thresholds": {"ib_min_rate_gbps": 800}}, now=0)
    assert r.code == "ib_rate"
    assert nodeinfo.ib_ports(str(tmp_path / "none")) is None
