# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The slurm inventory plugin's grouping, from real captured Slurm JSON (tests/fixtures/slurm)."""
from __future__ import annotations

from pathlib import Path

import pytest
from ansible.inventory.data import InventoryData

from ansible_collections.gpufleet.reliability.plugins.inventory.slurm import InventoryModule, node_groups
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import (
    Node,
    expand_hostlist_local,
    parse_nodes_json,
)
from support.loopback_http import LoopbackJSON

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def plugin(options):
    p = InventoryModule()
    p.inventory = InventoryData()
    opts = {"compose": {}, "groups": {}, "keyed_groups": [], "strict": False,
            "reason_groups": {"gpufleet": "gpufleet:"}}
    opts.update(options)
    p.get_option = opts.get
    return p


def groups_of(inv):
    return {name: sorted(h.name for h in g.get_hosts()) for name, g in inv.groups.items()
            if name not in ("all", "ungrouped")}


@pytest.mark.parametrize("sample", ["sinfo-json-22.05.json", "sinfo-json-24.11.json"])
def test_groups_from_captured_json(sample):
    nodes = parse_nodes_json((FIX / sample).read_text())
    p = plugin({})
    p.populate([n.to_dict() for n in nodes.values()])
    g = groups_of(p.inventory)
    assert g["slurm_partition_gpu"] == ["node1", "node2", "node3", "node4"]
    assert g["slurm_state_drain"][0] == "node2" and g["slurm_state_drained"][0] == "node2"
    assert "node2" not in g.get("slurm_state_idle", [])
    host = p.inventory.get_host("node2")
    assert host.vars["slurm_reason"] == "xid 79" and host.vars["slurm_flags"] == ["DRAIN"]
    assert "slurm_reason_gpufleet" not in g  # 'xid 79' is not ours


def test_reason_group_only_while_drained_or_down():
    ours = Node("a", state="idle", flags=frozenset({"DRAIN"}), reason="gpufleet: xid79")
    resumed = Node("b", state="idle", reason="gpufleet: xid79")  # 24.11 keeps the reason after RESUME
    down = Node("c", state="down", reason="gpufleet: gone", features=["h100", "IB-4x"])
    assert "slurm_reason_gpufleet" in node_groups(ours, {"gpufleet": "gpufleet:"})
    assert "slurm_reason_gpufleet" not in node_groups(resumed, {"gpufleet": "gpufleet:"})
    gd = node_groups(down, {"gpufleet": "gpufleet:"})
    assert {"slurm_state_down", "slurm_reason_gpufleet", "slurm_feature_h100", "slurm_feature_ib_4x"} <= set(gd)


def test_comment_json_becomes_data():
    recs = [Node("gpu7", state="idle", comment='{"attempts": 2, "last": "reboot"}').to_dict(),
            Node("gpu8", state="idle", comment="free text {").to_dict()]
    p = plugin({})
    p.populate(recs)
    assert p.inventory.get_host("gpu7").vars["slurm_comment_data"] == {"attempts": 2, "last": "reboot"}
    assert p.inventory.get_host("gpu8").vars["slurm_comment_data"] == {}


def test_verify_file_wants_the_suffix(tmp_path):
    good, bad = tmp_path / "c.slurm.yml", tmp_path / "c.yml"
    good.write_text("plugin: gpufleet.reliability.slurm\n")
    bad.write_text("plugin: gpufleet.reliability.slurm\n")
    assert InventoryModule().verify_file(str(good)) and not InventoryModule().verify_file(str(bad))


def test_local_hostlist_expansion():
    assert expand_hostlist_local("gpu[01-03,7]x,n1") == ["gpu01x", "gpu02x", "gpu03x", "gpu7x", "n1"]
    assert expand_hostlist_local("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    with pytest.raises(ValueError):
        expand_hostlist_local("gpu[3-1]")


class _Slurmrestd(LoopbackJSON):
    """A loopback HTTP server that answers GET /slurm/<v>/nodes from a list of (status, body), then the last one;
    ``requests`` keeps (path, X-SLURM-USER-TOKEN) of each."""

    def __init__(self, answers):
        self.answers = list(answers)
        super().__init__(lambda _path, _headers: self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])

    @property
    def tokens(self):
        return [(path, headers.get("X-SLURM-USER-TOKEN")) for path, headers in self.requests]


def rest_plugin(url, retries):
    return plugin({"source": "rest", "rest_url": url, "rest_user": "slurm", "rest_token": "t0k",
                   "rest_api_version": "v0.0.42", "rest_timeout": 10, "validate_certs": False,
                   "rest_retries": retries})


def test_rest_source_tries_a_gateway_error_again_and_then_reads_the_nodes():
    good = (FIX / "sinfo-json-24.11.json").read_text()
    server = _Slurmrestd([(502, '{"errors": [{"error": "Unable to contact slurm controller"}]}'), (200, good)])
    try:
        records = rest_plugin(server.url, retries=2)._fetch_rest()
    finally:
        server.close()
    assert len(server.requests) == 2
    assert server.tokens[0] == ("/slurm/v0.0.42/nodes", "t0k")
    assert sorted(r["name"] for r in records) == sorted(parse_nodes_json(good))


def test_rest_source_gives_up_after_its_retries_and_says_how_many_tries():
    from ansible.errors import AnsibleParserError

    server = _Slurmrestd([(503, "{}")])
    try:
        with pytest.raises(AnsibleParserError, match=r"failed \(after 2 tries\): HTTP Error 503"):
            rest_plugin(server.url, retries=1)._fetch_rest()
    finally:
        server.close()
    assert len(server.requests) == 2


def test_rest_source_fails_at_once_on_a_refused_token_and_a_bad_retries():
    from ansible.errors import AnsibleParserError

    server = _Slurmrestd([(401, '{"errors": [{"error": "Authentication failure"}]}')])
    try:
        with pytest.raises(AnsibleParserError, match=r"/nodes failed: HTTP Error 401"):
            rest_plugin(server.url, retries=3)._fetch_rest()
        with pytest.raises(AnsibleParserError, match=r"rest_retries: expected an integer >= 0, got -1"):
            rest_plugin(server.url, retries=-1)._fetch_rest()
    finally:
        server.close()
    assert len(server.requests) == 1
