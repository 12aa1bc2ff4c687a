# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: startup_script
short_description: Install or remove one node startup script run by gpufleet-startup
version_added: "0.1.0"
description:
  - Manages one script in the startup scripts directory that C(gpufleet-startup) runs when the node boots, before
    slurmd takes jobs (see the C(gpufleet.reliability.startup_scripts) role).
  - The script is written to O(scripts_dir)/O(name) (mode 0755) and its metadata (order, phase, timeout, retries,
    environment, node roles) to O(scripts_dir)/O(name).json (mode 0644). Both writes are atomic.
  - Before anything is written the script is checked. It must start with a shebang (C(#!)). Shell scripts
    (bash, sh, dash) must pass C(bash -n) (C(sh -n) for sh and dash), Python scripts must compile, and an
    interpreter given as an absolute path must exist and be executable. A script that fails a check is refused
    with a message that names the script and the error; nothing is changed.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
options:
  name:
    description:
      - File name of the script in O(scripts_dir), for example C(20-mount-scratch.sh).
      - 1-128 characters of letters, digits and C(_.@+-), starting with a letter or digit, not ending in C(.json).
    type: str
    required: true
  content:
    description:
      - The script text. Mutually exclusive with O(src). One of them is required when O(state=present).
    type: str
  src:
    description:
      - Path of the script on the managed node to install. Mutually exclusive with O(content).
    type: path
  order:
    description:
      - Scripts run in ascending O(order), then by O(name).
    type: int
    default: 50
  phase:
    description:
      - V(once) runs at the first boot only; after it succeeds it is marked done in the runner's state directory
        and never runs again.
      - V(boot) runs once per boot (a rerun of the runner during the same boot skips it after it succeeded).
      - V(every_boot) runs every time the runner runs.
    type: str
    choices: [boot, every_boot, once]
    default: every_boot
  timeout:
    description:
      - Seconds before the script's whole process group is killed (SIGTERM, then SIGKILL) and the attempt fails.
    type: int
    default: 300
  retries:
    description:
      - How many more times a failing (or timed-out) script is run before it counts as failed.
    type: int
    default: 0
  retry_delay:
    description:
      - Seconds between attempts.
    type: int
    default: 5
  optional:
    description:
      - When V(true) a failure of this script is logged but does not stop the run or keep the node drained.
    type: bool
    default: false
  environment:
    description:
      - Extra environment variables for the script (name to value).
    type: dict
  roles:
    description:
      - The node roles this script applies to; the runner, started with C(--role), skips the others.
    type: list
    elements: str
    choices: [worker, login, controller]
    default: [worker, login, controller]
  state:
    description:
      - V(present) installs or updates the script and its metadata, V(absent) removes both.
    type: str
    choices: [present, absent]
    default: present
  scripts_dir:
    description:
      - The startup scripts directory; created (mode 0755) when missing.
    type: path
    default: /etc/gpufleet/startup.d
notes:
  - The runner only runs scripts that have a metadata file; the module writes the script first and the metadata
    last, and removes the metadata first.
seealso:
  - name: Startup scripts
    description: The runner, the systemd unit and how a failing script keeps the node drained.
    link: https://github.com/gpufleet/reliability/blob/main/docs/startup.md
"""

EXAMPLES = r"""
- name: Mount the scratch file system before slurmd starts (workers only)
  gpufleet.reliability.startup_script:
    name: 20-mount-scratch.sh
    order: 20
    phase: every_boot
    timeout: 120
    retries: 2
    roles: [worker]
    content: |
      #!/usr/bin/env bash
      set -euo pipefail
      mountpoint -q /scratch || mount /scratch

- name: Enroll the node once
  gpufleet.reliability.startup_script:
    name: 05-enroll
    phase: once
    src: /usr/local/share/site/enroll.sh
    environment:
      SITE: eu-1

- name: Remove an old script
  gpufleet.reliability.startup_script:
    name: 30-legacy.sh
    state: absent
"""

RETURN = r"""
script:
  description: Path of the script file.
  returned: always
  type: str
  sample: /etc/gpufleet/startup.d/20-mount-scratch.sh
metadata_file:
  description: Path of the metadata file.
  returned: always
  type: str
  sample: /etc/gpufleet/startup.d/20-mount-scratch.sh.json
metadata:
  description: The metadata as written (state=present).
  returned: when state is present
  type: dict
  sample: {"name": "20-mount-scratch.sh", "order": 20, "phase": "every_boot", "timeout": 120, "retries": 2,
           "retry_delay": 5, "optional": false, "environment": {}, "roles": ["worker"], "version": 1}
interpreter:
  description: The script's interpreter from its shebang.
  returned: when state is present
  type: str
  sample: bash
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native, to_text

from ansible_collections.gpufleet.reliability.plugins.module_utils.diff import file_changes
from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write
from ansible_collections.gpufleet.reliability.plugins.module_utils.startup.scripts import (
    NODE_ROLES,
    PHASES,
    MetaError,
    interpreter_name,
    meta_from_dict,
    meta_path,
    shebang,
    validate_name,
)

SHELLS = {"bash": "bash", "sh": "sh", "dash": "sh"}


def read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def check_script(module, name, content):
    """Return the interpreter name, or fail the module with a message naming the script and the error."""
    words = shebang(content)
    if words is None:
        first = to_text(content.split(b"\n", 1)[0][:80], errors="surrogate_or_replace")
        module.fail_json(msg=f"startup_script {name}: the script must start with a shebang line such as "
                             f"'#!/usr/bin/env bash'; the first line is {first!r}")
    interp = interpreter_name(words)
    if os.path.isabs(words[0]) and not os.access(words[0], os.X_OK):
        module.fail_json(msg=f"startup_script {name}: interpreter {words[0]} in the shebang does not exist or is "
                             "not executable on this node")
    if interp in SHELLS or interp.startswith("python"):
        tmpdir = tempfile.mkdtemp(prefix="gpufleet-startup-check-")
        try:
            path = os.path.join(tmpdir, name)
            with open(path, "wb") as handle:
                handle.write(content)
            if interp in SHELLS:
                checker = module.get_bin_path(SHELLS[interp], required=True)
                rc, out, err = module.run_command([checker, "-n", path])
                label = f"{SHELLS[interp]} -n"
            else:
                try:
                    compile(content, name, "exec")
                    rc, out, err = 0, "", ""
                except (SyntaxError, ValueError) as exc:
                    rc, out, err = 1, "", f"line {getattr(exc, 'lineno', '?')}: {exc}"
                label = "Python compile"
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        if rc != 0:
            detail = (err or out).strip().replace(path, name)
            module.fail_json(msg=f"startup_script {name}: syntax check ({label}) failed, script not installed: "
                                 f"{detail}", rc=rc, stderr=err.replace(path, name), stdout=out)
    return interp


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            content=dict(type="str"),
            src=dict(type="path"),
            order=dict(type="int", default=50),
            phase=dict(type="str", choices=list(PHASES), default="every_boot"),
            timeout=dict(type="int", default=300),
            retries=dict(type="int", default=0),
            retry_delay=dict(type="int", default=5),
            optional=dict(type="bool", default=False),
            environment=dict(type="dict"),
            roles=dict(type="list", elements="str", choices=list(NODE_ROLES), default=list(NODE_ROLES)),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            scripts_dir=dict(type="path", default="/etc/gpufleet/startup.d"),
        ),
        mutually_exclusive=[("content", "src")],
        required_if=[("state", "present", ("content", "src"), True)],
        supports_check_mode=True,
    )
    p = module.params
    try:
        name = validate_name(p["name"])
    except MetaError as exc:
        module.fail_json(msg=f"startup_script: {exc}")
    scripts_dir = p["scripts_dir"]
    script_path = os.path.join(scripts_dir, name)
    json_path = meta_path(scripts_dir, name)
    result = dict(changed=False, script=script_path, metadata_file=json_path)
    old_script = read_bytes(script_path)
    old_meta = read_bytes(json_path)

    if p["state"] == "absent":
        present = [path for path, old in ((json_path, old_meta), (script_path, old_script)) if old is not None]
        if present:
            result["changed"] = True
            result["diff"] = [entry for path, old in ((script_path, old_script), (json_path, old_meta))
                              for entry in file_changes(path, old, None)]
            if not module.check_mode:
                for path in present:
                    os.unlink(path)
        module.exit_json(**result)

    if p["content"] is not None:
        content = p["content"].encode("utf-8")
    else:
        content = read_bytes(p["src"])
        if content is None:
            module.fail_json(msg=f"startup_script {name}: src {p['src']} does not exist on the managed node")
    try:
        meta = meta_from_dict(dict(
            name=name, order=p["order"], phase=p["phase"], timeout=p["timeout"], retries=p["retries"],
            retry_delay=p["retry_delay"], optional=p["optional"], environment=p["environment"] or {},
            roles=p["roles"],
        ), source=f"startup_script {name}")
    except MetaError as exc:
        module.fail_json(msg=str(exc))
    interp = check_script(module, name, content)
    meta_bytes = meta.to_json().encode("utf-8")
    result["metadata"] = meta.to_dict()
    result["interpreter"] = interp

    diffs = []
    writes = []
    for path, old, new, mode in ((script_path, old_script, content, 0o755), (json_path, old_meta, meta_bytes, 0o644)):
        cur_mode = os.stat(path).st_mode & 0o7777 if old is not None else None
        if old != new or cur_mode != mode:
            writes.append((path, new if old != new else None, mode))
            diffs += file_changes(path, old, new, cur_mode, mode)
    if writes:
        result["changed"] = True
        result["diff"] = diffs
        if not module.check_mode:
            try:
                if not os.path.isdir(scripts_dir):
                    os.makedirs(scripts_dir, mode=0o755)
                for path, data, mode in writes:  # the script first, its metadata last
                    if data is None:
                        os.chmod(path, mode)
                    else:
                        atomic_write(path, data, mode)
            except OSError as exc:
                module.fail_json(msg=f"startup_script {name}: cannot write {exc.filename}: {to_native(exc)}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
