# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
name: slurm
short_description: Slurm nodes as inventory hosts, grouped by state, partition, feature and drain reason
version_added: "0.1.0"
description:
  - Reads every node from Slurm once (C(sinfo --json) on 22.05, C(scontrol show node --json) on 23.02+, or
    slurmrestd's C(/nodes) with a JWT) and makes each node a host.
  - "Groups: C(slurm_state_<state>) for the state C(sinfo -o %T) shows, without its suffix (C(idle), C(mixed),
    C(allocated), C(down), C(drained), C(draining), C(completing), C(reboot), ...), so a drained node is in
    C(slurm_state_drained), not C(slurm_state_idle); C(slurm_state_<flag>) for every state flag
    (C(slurm_state_drain), C(slurm_state_not_responding), C(slurm_state_completing),
    C(slurm_state_reboot_requested), ...); C(slurm_partition_<partition>); C(slurm_feature_<feature>);"
  - C(slurm_reason_<name>) for each O(reason_groups) prefix the node's reason starts with (by default
    C(slurm_reason_gpufleet) for reasons starting C(gpufleet:)), only while the node is drained or down.
  - The base state (C(idle) for a drained idle node, C(down) for a drained down node) is the host variable
    C(slurm_state); use O(keyed_groups) on it for groups by base state.
  - Group names are lower case with characters other than letters, digits and C(_) replaced by C(_).
  - "Host variables: C(slurm_state), C(slurm_flags), C(slurm_sinfo_state), C(slurm_reason), C(slurm_reason_user),
    C(slurm_reason_time), C(slurm_partitions), C(slurm_features), C(slurm_gres), C(slurm_gres_used),
    C(slurm_comment), C(slurm_comment_data) (the comment parsed as JSON when it is a JSON object),
    C(slurm_extra), C(slurm_boot_time), C(slurm_drained), C(slurm_draining), C(slurm_address), C(slurm_cpus),
    C(slurm_alloc_cpus), C(slurm_version), C(slurm_next_state)."
  - The configuration file must end in C(.slurm.yml) or C(.slurm.yaml).
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.constructed
  - ansible.builtin.inventory_cache
options:
  plugin:
    description: The name of this plugin; must be C(gpufleet.reliability.slurm).
    type: str
    required: true
    choices: [gpufleet.reliability.slurm]
  source:
    description:
      - V(cli) runs the Slurm commands on the controller (needs the Slurm client and munge there).
      - V(rest) asks slurmrestd (for AWX execution environments, which have neither); see O(rest_url).
    type: str
    choices: [cli, rest]
    default: cli
  slurm_conf:
    description: With V(source=cli), the C(slurm.conf) the commands use (E(SLURM_CONF)).
    type: path
    env:
      - name: SLURM_CONF
  nodes:
    description: Only these nodes (a hostlist expression); all nodes when not given.
    type: str
  reason_groups:
    description:
      - Group suffix to reason prefix; a drained or down node whose reason starts with the prefix joins
        C(slurm_reason_<suffix>).
    type: dict
    default: {gpufleet: "gpufleet:"}
  rest_url:
    description: With V(source=rest), the slurmrestd base URL, for example C(https://slurm-ctl:6820).
    type: str
    env:
      - name: SLURMRESTD_URL
  rest_api_version:
    description:
      - With V(source=rest), the OpenAPI version in the path (C(/slurm/<version>/nodes)); C(v0.0.38) is the one
        Slurm 22.05 has, C(v0.0.42) is Slurm 24.11's.
    type: str
    default: v0.0.38
  rest_user:
    description: With V(source=rest), the Slurm user name sent as C(X-SLURM-USER-NAME).
    type: str
    env:
      - name: SLURM_USER_NAME
  rest_token:
    description: With V(source=rest), the JWT sent as C(X-SLURM-USER-TOKEN).
    type: str
    env:
      - name: SLURM_JWT
  rest_timeout:
    description: Seconds before a slurmrestd request fails.
    type: int
    default: 30
  rest_retries:
    description:
      - With V(source=rest), how many times a request is tried again after slurmrestd answers C(502), C(503) or
        C(504) (slurmrestd says C(502 Bad Gateway) while it cannot reach a busy or restarting slurmctld) or the
        connection fails; 1, 2, 4, ... seconds apart. Any other HTTP error (a bad token, a wrong version) fails at
        once.
    type: int
    default: 3
    version_added: "0.4.0"
  validate_certs:
    description: With V(source=rest), verify the slurmrestd TLS certificate.
    type: bool
    default: true
notes:
  - Slurm 24.11 keeps the last reason on a node after it is resumed; C(slurm_reason_<suffix>) groups therefore only
    hold nodes that are drained or down now.
"""

EXAMPLES = r"""
# cluster.slurm.yml
plugin: gpufleet.reliability.slurm
slurm_conf: /etc/slurm/slurm.conf
compose:
  ansible_host: slurm_address
keyed_groups:
  - key: slurm_gres | regex_replace('^gpu:([^:]+):.*$', '\\1')
    prefix: gpu_model
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: /tmp/slurm-inventory-cache
cache_timeout: 60

---
# awx.slurm.yml: from an AWX execution environment, through slurmrestd
plugin: gpufleet.reliability.slurm
source: rest
rest_url: https://slurm-ctl.example.org:6820
rest_api_version: v0.0.42
# rest_user / rest_token from the environment: SLURM_USER_NAME, SLURM_JWT (an AWX credential)
"""

import json
import re
import time
from typing import Any, Dict, List, Mapping, Optional
from urllib.error import HTTPError

from ansible.errors import AnsibleParserError
from ansible.module_utils.common.text.converters import to_native
from ansible.module_utils.urls import open_url
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurm import (
    Node,
    SlurmClient,
    SlurmError,
    expand_hostlist_local,
    parse_nodes_json,
)

_BAD = re.compile(r"[^a-z0-9_]")
# slurmrestd answers 502 while it cannot reach slurmctld; a proxy in front of it answers 503 or 504
RETRIED_HTTP = (502, 503, 504)


def group_name(*parts: Any) -> str:
    return _BAD.sub("_", "_".join(str(p) for p in parts).lower())


def node_groups(node: Node, reason_groups: Optional[Mapping[str, str]]) -> List[str]:
    """The inventory groups a Node belongs to."""
    groups = [group_name("slurm_state", re.sub(r"[*~#%$@^!]+$", "", node.sinfo_state))]
    groups += [group_name("slurm_state", f) for f in sorted(node.flags)]
    groups += [group_name("slurm_partition", p) for p in node.partitions]
    groups += [group_name("slurm_feature", f) for f in node.features]
    for suffix, prefix in sorted((reason_groups or {}).items()):
        # only while the node is out of service and the reason is that owner's (the rule of slurmfacts.py)
        if isinstance(prefix, str) and prefix.strip() and node.drained_by(prefix):
            groups.append(group_name("slurm_reason", suffix))
    out = []
    for g in groups:
        if g not in out:
            out.append(g)
    return out


def node_hostvars(node: Node) -> Dict[str, Any]:
    d = node.to_dict()
    hv = {f"slurm_{k}": v for k, v in d.items() if k != "name"}
    try:
        data = json.loads(node.comment) if node.comment.strip().startswith("{") else None
    except ValueError:
        data = None
    hv["slurm_comment_data"] = data if isinstance(data, dict) else {}
    return hv


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "gpufleet.reliability.slurm"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith((".slurm.yml", ".slurm.yaml"))

    def _fetch_cli(self) -> List[Dict[str, Any]]:
        env = {}
        if self.get_option("slurm_conf"):
            env["SLURM_CONF"] = self.get_option("slurm_conf")
        client = SlurmClient(backend="cli", env=env)
        nodes = client.nodes(self.get_option("nodes") or None)
        return [n.to_dict() for n in nodes.values()]

    def _fetch_rest(self) -> List[Dict[str, Any]]:
        url, user, token = (self.get_option(k) for k in ("rest_url", "rest_user", "rest_token"))
        missing = [k for k, v in (("rest_url", url), ("rest_user", user), ("rest_token", token)) if not v]
        if missing:
            raise AnsibleParserError(f"slurm inventory: source=rest needs {', '.join(missing)}")
        full = f"{url.rstrip('/')}/slurm/{self.get_option('rest_api_version')}/nodes"
        retries = self.get_option("rest_retries")
        if retries is None or retries < 0:
            raise AnsibleParserError(f"slurm inventory: rest_retries: expected an integer >= 0, got {retries}")
        for attempt in range(retries + 1):
            try:
                resp = open_url(full, headers={"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token},
                                timeout=self.get_option("rest_timeout"),
                                validate_certs=self.get_option("validate_certs"))
                text = to_native(resp.read())
                break
            except Exception as exc:  # noqa: BLE001 - urllib/HTTP errors of any kind
                # an HTTP answer other than a gateway error is final; so is the last try
                final = isinstance(exc, HTTPError) and exc.code not in RETRIED_HTTP
                if final or attempt == retries:
                    tries = f" (after {attempt + 1} tries)" if attempt else ""
                    raise AnsibleParserError(f"slurm inventory: GET {full} failed{tries}: {to_native(exc)}")
                time.sleep(2 ** attempt)
        nodes = parse_nodes_json(text)
        wanted = self.get_option("nodes")
        if wanted:
            try:
                names = expand_hostlist_local(wanted)
            except ValueError as exc:
                raise AnsibleParserError(f"slurm inventory: nodes: {exc}")
            nodes = {n: v for n, v in nodes.items() if n in names}
        return [n.to_dict() for n in nodes.values()]

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        records = None
        if use_cache:
            try:
                records = self._cache[cache_key]
            except KeyError:
                update_cache = True
        if records is None:
            try:
                records = self._fetch_rest() if self.get_option("source") == "rest" else self._fetch_cli()
            except SlurmError as exc:
                raise AnsibleParserError(f"slurm inventory: {exc.msg}")
        if update_cache:
            self._cache[cache_key] = records
        self.populate(records)

    def populate(self, records: List[Dict[str, Any]]) -> None:
        strict = self.get_option("strict")
        reason_groups = self.get_option("reason_groups")
        for rec in records:
            node = Node.from_dict(rec)
            host = node.name
            self.inventory.add_host(host)
            for key, value in node_hostvars(node).items():
                self.inventory.set_variable(host, key, value)
            for g in node_groups(node, reason_groups):
                self.inventory.add_group(g)
                self.inventory.add_child(g, host)
            hostvars = self.inventory.get_host(host).get_vars()
            self._set_composite_vars(self.get_option("compose"), hostvars, host, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), hostvars, host, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), hostvars, host, strict=strict)
