#!/usr/bin/python
# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_conf
short_description: Manage keys and NodeName / PartitionName lines in slurm.conf, gres.conf and cgroup.conf
version_added: "0.1.0"
description:
  - Edits a Slurm configuration file in place. Comments, blank lines, the order of lines, spacing,
    C(\) line continuations and C(Include) lines are kept; only the values that change are rewritten.
  - Keys are matched case-insensitively, as Slurm reads them. Node and partition names are case-sensitive.
  - Values of keys the module knows (integers, booleans, enumerations such as C(HealthCheckNodeState) or
    C(PrologFlags), absolute paths, exit-code lists) are validated, and the whole file is checked before
    anything is written. A malformed line or a bad value fails with a message that names the line or key and
    what was expected; the file is then left untouched.
  - The file is written atomically (temporary file in the same directory, then rename), keeping its mode and
    owner.
  - The module never restarts or reconfigures Slurm. It returns RV(reconfigure_needed) and
    RV(restart_needed) so that a handler can run C(scontrol reconfigure) or report that a restart is due.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
options:
  path:
    description:
      - The configuration file to edit.
    type: path
    required: true
  kind:
    description:
      - Which file format O(path) is.
      - When not given, it is taken from the file name (C(slurm.conf), C(gres.conf), C(cgroup.conf)).
    type: str
    choices: [slurm, gres, cgroup]
  settings:
    description:
      - "Global keys to set, as C(Key: value). A value of V(null) removes the key (every occurrence)."
      - A list value is joined with commas (for example C(PrologFlags)); for C(SlurmctldHost) a list gives one
        line per host, in order.
      - Booleans are written as C(YES)/C(NO) in slurm.conf and C(yes)/C(no) in cgroup.conf.
      - When a key appears more than once, the last occurrence is changed, because that is the one Slurm uses.
    type: dict
    default: {}
  merge_keys:
    description:
      - Keys of O(settings) whose flags are added to the file's current value instead of replacing it (compared
        case-blind, the current flags first, in their order). By default C(PrologFlags), so a site's C(Contain)
        (which C(pam_slurm_adopt) needs) and C(X11) stay when a play adds C(Alloc). V([]) replaces every key as
        given, which is how a flag is removed.
    type: list
    elements: str
    default: [PrologFlags]
    version_added: "0.4.0"
  nodes:
    description:
      - C(NodeName=...) lines. Each item is a dict of keys for one line and must contain C(NodeName); the line
        is found by its C(NodeName) value exactly as written (a hostlist such as C(node[1-4]) is one line).
      - In gres.conf the line is found by C(NodeName) together with C(Name) and C(Type).
      - The lower-case key C(state) says whether the line is V(present) (default) or V(absent). Slurm's own
        C(State=) key on a node line must be written with a capital C(S).
      - With V(present), the given keys are set on the line (a value of V(null) removes that key), other keys
        on the line are kept, and a missing line is added after the last line of its kind.
    type: list
    elements: dict
    default: []
  partitions:
    description:
      - C(PartitionName=...) lines in slurm.conf, handled like O(nodes) and found by C(PartitionName).
    type: list
    elements: dict
    default: []
  backup:
    description:
      - Copy the old file to a time-stamped backup next to it before writing.
    type: bool
    default: false
  validate:
    description:
      - Validate the values of known keys, both the ones given and the ones already in the file.
      - With V(false) only the syntax is checked.
    type: bool
    default: true
  create:
    description:
      - Create O(path) (mode C(0644)) when it does not exist. Otherwise a missing file is an error.
    type: bool
    default: false
  slurm_version:
    description:
      - The Slurm release the file is for (for example V(22.05.8) or V(24.11)); it decides which changes need a
        restart (RV(restart_needed)). From 23.11 on, C(scontrol reconfigure) starts new daemon processes, so only
        listening ports and authentication settings need a restart.
      - When not given, C(scontrol --version) is asked if C(scontrol) is on the PATH (with C(SLURM_CONF) from the
        environment, else the slurm.conf next to O(path)); when that fails too, the rules of 22.05 are used,
        which is the cautious choice.
    type: str
notes:
  - Which changes need a restart instead of C(scontrol reconfigure) follows slurm.conf(5) and gres.conf(5) of
    Slurm 22.05 (for example C(SlurmctldPort), C(SlurmdPort), C(AuthType), C(AuthAltTypes), C(SelectType),
    C(ProctrackType), C(GresTypes), C(StateSaveLocation), any change of a C(NodeName) line, gres C(Type) and
    C(Cores)). From Slurm 23.11 on, scontrol(1) says reconfigure cannot change listening TCP ports or the
    authentication mechanism, and everything else takes effect. The lists are in the collection's
    C(module_utils/slurmconf.py) (C(RESTART_KEYS), C(RESTART_KEYS_2311)).
  - C(Include) files are not followed; keys set there are not seen.
seealso:
  - name: slurm.conf(5)
    description: The Slurm configuration file.
    link: https://slurm.schedmd.com/slurm.conf.html
  - name: gres.conf(5)
    description: Generic resource configuration.
    link: https://slurm.schedmd.com/gres.conf.html
  - module: gpufleet.reliability.slurm_node
"""

EXAMPLES = r"""
- name: Health check every 5 minutes on every node, reboots through a program
  gpufleet.reliability.slurm_conf:
    path: /etc/slurm/slurm.conf
    settings:
      HealthCheckProgram: /opt/gpufleet/bin/gpufleet-healthcheck
      HealthCheckInterval: 300
      HealthCheckNodeState: ANY
      RebootProgram: /usr/sbin/reboot
      ResumeTimeout: 1800
      PrologFlags: [Alloc, DeferBatch]   # added to the site's flags (merge_keys), Contain and X11 stay
      SchedulerTimeSlice: null   # remove
  register: conf
  notify: Reconfigure slurm

- name: Add a node line and drop an old partition
  gpufleet.reliability.slurm_conf:
    path: /etc/slurm/slurm.conf
    nodes:
      - NodeName: gpu[001-016]
        CPUs: 96
        RealMemory: 1000000
        Gres: gpu:h100:8
    partitions:
      - PartitionName: old
        state: absent
    backup: true

- name: Let slurmd find the GPUs through NVML
  gpufleet.reliability.slurm_conf:
    path: /etc/slurm/gres.conf
    settings:
      AutoDetect: nvml
"""

RETURN = r"""
kind:
  description: The file format that was used.
  returned: always
  type: str
  sample: slurm
changes:
  description: What changed, one item per key or line (C(Key), C(NodeName=n1 Port), C(PartitionName=old)).
  returned: always
  type: list
  elements: str
  sample: [HealthCheckInterval, "PartitionName=old"]
reconfigure_needed:
  description: True when the file changed and C(scontrol reconfigure) is enough for the change to take effect.
  returned: always
  type: bool
  sample: true
restart_needed:
  description: True when the file changed in a way that needs slurmctld and/or slurmd to be restarted.
  returned: always
  type: bool
  sample: false
restart_reasons:
  description: The changed keys or lines that need a restart.
  returned: always
  type: list
  elements: str
  sample: [SlurmctldPort]
slurm_version:
  description:
    - The Slurm release used to decide RV(restart_needed) (given, or from C(scontrol --version)).
    - Null when not given and unknown, or when nothing changed.
  returned: always
  type: str
  sample: "22.05.8"
current:
  description:
    - The file's global settings and C(Include) lines as they were before any change, in file order, one
      C(key)/C(value) item each (keys spelt as slurm.conf(5) spells them; an C(Include) line has the key
      C(Include) and the included file as value). Node and partition lines are left out.
    - With no O(settings), O(nodes) or O(partitions) the module only reads the file, so this is how a play
      finds, for example, the C(HealthCheckProgram) or C(Epilog) a site already has and where its C(Include)
      lines are. Slurm uses the last occurrence of a repeated key.
    - Empty when the file does not exist yet.
  returned: always
  type: list
  elements: dict
  sample: [{key: HealthCheckProgram, value: /usr/sbin/nhc}, {key: Include, value: /etc/slurm/gpufleet.conf}]
backup_file:
  description: Name of the backup of the old file.
  returned: when O(backup=true) and the file changed
  type: str
  sample: /etc/slurm/slurm.conf.2371.2026-12-02@17:20:01~
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.diff import change
from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmconf import (
    ConfFile,
    SlurmConfError,
    canonical_key,
    guess_kind,
    merge_flags,
    parse_version,
    write_atomic,
)


def _slurm_version(module, detect):
    given = module.params["slurm_version"]
    if given:
        if parse_version(given) is None:
            module.fail_json(msg=f"slurm_version: expected a release such as 22.05.8 or 24.11, got {given!r}")
        return given
    if not detect:
        return None
    scontrol = module.get_bin_path("scontrol")
    if not scontrol:
        return None
    # scontrol reads a slurm.conf even for --version: the one in the environment, else the one next to path
    env = {}
    sibling = os.path.join(os.path.dirname(os.path.abspath(module.params["path"])), "slurm.conf")
    if not os.environ.get("SLURM_CONF") and os.path.isfile(sibling):
        env["SLURM_CONF"] = sibling
    rc, out, _err = module.run_command([scontrol, "--version"], environ_update=env)
    if rc != 0 or parse_version(out) is None:
        return None
    return out.split()[-1].strip()


def _records(module, conf, head, items, option):
    for number, item in enumerate(items):
        where = f"{option}[{number}]"
        attrs = dict(item)
        state = attrs.pop("state", "present")
        if state not in ("present", "absent"):
            module.fail_json(msg=f"{where}.state must be present or absent, got {state!r} (Slurm's own State= key "
                                 "is written State, with a capital S)")
        if not any(k.lower() == head for k in attrs):
            module.fail_json(msg=f"{where}: {canonical_key(conf.kind, head, head)} is required")
        try:
            conf.set_record(head, attrs, state)
        except SlurmConfError as exc:
            module.fail_json(msg=f"{where}: {exc}")


def _describe(conf):
    out = []
    for scope, name, key in conf.changes:
        if scope == "global":
            text = key
        else:
            label = f"{canonical_key(conf.kind, scope, scope)}={name}"
            text = label if key is None else f"{label} {key}"
        if text not in out:
            out.append(text)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            kind=dict(type="str", choices=["slurm", "gres", "cgroup"]),
            settings=dict(type="dict", default={}),
            merge_keys=dict(type="list", elements="str", default=["PrologFlags"], no_log=False),
            nodes=dict(type="list", elements="dict", default=[]),
            partitions=dict(type="list", elements="dict", default=[]),
            backup=dict(type="bool", default=False),
            validate=dict(type="bool", default=True),
            create=dict(type="bool", default=False),
            slurm_version=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    path = params["path"]
    kind = params["kind"] or guess_kind(path)
    if kind is None:
        module.fail_json(msg=f"kind: cannot tell from the file name {os.path.basename(path)!r} whether it is "
                             "slurm.conf, gres.conf or cgroup.conf; set kind to slurm, gres or cgroup")
    if params["partitions"] and kind != "slurm":
        module.fail_json(msg=f"partitions: PartitionName lines exist only in slurm.conf, not in {kind}.conf")

    exists = os.path.exists(path)
    if not exists and not params["create"]:
        module.fail_json(msg=f"path: {path} does not exist (set create=true to create it)")
    if exists and not os.path.isfile(path):
        module.fail_json(msg=f"path: {path} is not a regular file")
    try:
        if exists:
            conf = ConfFile.load(path, kind, validate=params["validate"])
        else:
            conf = ConfFile("", kind, path=path, validate=params["validate"])
    except SlurmConfError as exc:
        module.fail_json(msg=str(exc))
    except (OSError, UnicodeError) as exc:
        module.fail_json(msg=f"path: cannot read {path}: {exc}")

    current = conf.outline()
    merge = {canonical_key(kind, k).lower() for k in params["merge_keys"]}
    for key, value in params["settings"].items():
        try:
            if value is None:
                conf.remove(key)
            else:
                if canonical_key(kind, key).lower() in merge:
                    value = merge_flags(conf.get(key), value)
                conf.set(key, value)
        except SlurmConfError as exc:
            module.fail_json(msg=f"settings.{key}: {exc}")
    _records(module, conf, "nodename", params["nodes"], "nodes")
    _records(module, conf, "partitionname", params["partitions"], "partitions")

    before, after = conf.original, conf.render()
    changed = before != after or not exists
    if changed:
        try:
            ConfFile(after, kind, path=path, validate=params["validate"])  # what we write must read back
        except SlurmConfError as exc:  # pragma: no cover - guards against editor bugs
            module.fail_json(msg=f"internal error, nothing written: the edited file does not parse: {exc}")
    version = _slurm_version(module, detect=changed)
    reasons = conf.restart_reasons(version) if changed else []
    result = dict(
        changed=changed,
        kind=kind,
        slurm_version=version,
        changes=_describe(conf) if changed else [],
        restart_needed=bool(reasons),
        restart_reasons=reasons,
        reconfigure_needed=changed and not reasons,
        current=[dict(key=key, value=value) for key, value in current],
    )
    if module._diff:
        result["diff"] = change(path, before, after)
    if changed and not module.check_mode:
        try:
            backup_file = write_atomic(path, after, backup=params["backup"])
        except OSError as exc:
            module.fail_json(msg=f"path: cannot write {path}: {exc}", **result)
        if backup_file:
            result["backup_file"] = backup_file
    module.exit_json(**result)


if __name__ == "__main__":
    main()
