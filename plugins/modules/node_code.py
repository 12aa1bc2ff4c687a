# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_code
short_description: Install the collection's node-side code (entry modules and everything they import) in one step
version_added: "0.4.0"
description:
  - Installs the C(module_utils) files a node-side command needs (the health agent, the startup runner, the PAM
    glue) under O(dest) on the node, laid out as in the collection, so their relative imports work there.
  - The files are the O(entries) and every C(module_utils) file they import, transitively, as the
    C(gpufleet.reliability.node_files) filter derives them on the controller from the code under O(src). A new
    import is shipped with no list to edit.
  - The node keeps a record of what was installed - the collection version, the tree's sha256 and the entries - in
    C(.gpufleet-node-code/<id>.json) under O(dest), one record per set of entries (roles that share O(dest) keep
    their own). In diff mode the headers say C(gpufleet node code 0.1.0 (tree ...)) before and after, and the diff
    is a manifest (each file's mode, the start of its sha256 and its path) with the changed lines only, not the
    files' source.
  - All files go in one module run, not one task item per file (a per-file C(ansible.builtin.copy) loop costs one
    module round trip per file and per directory, on every node). Each file that differs is replaced atomically
    (a temporary file in the same directory, then a rename); files that are the same are not touched. Directories
    are created as needed and given O(directory_mode).
  - Files under O(dest) that the entries no longer import are left in place (another role may share O(dest)).
  - This module has an action plugin of the same name, which reads the files on the controller; O(files) is set
    by it.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
options:
  entries:
    description:
      - The entry modules, relative to O(src), for example C(cli/health_agent.py).
    type: list
    elements: str
    required: true
  src:
    description:
      - The collection's C(plugins/module_utils) directory on the controller.
    type: path
    required: true
  dest:
    description:
      - The directory on the node that stands for C(module_utils), for example
        C(/opt/gpufleet/lib/ansible_collections/gpufleet/reliability/plugins/module_utils). Created with its parents
        if missing.
    type: path
    required: true
  mode:
    description:
      - The permission bits of every file, as an octal string.
    type: str
    default: "0644"
  directory_mode:
    description:
      - The permission bits of O(dest) and of every directory under it that holds a file, as an octal string.
    type: str
    default: "0755"
  files:
    description:
      - Set by the action plugin, not by a playbook - each file's path relative to O(dest) and its text.
    type: dict
    required: true
  version:
    description:
      - Set by the action plugin, not by a playbook - the version of the collection the files come from
        (its C(MANIFEST.json), or C(galaxy.yml) in a checkout); recorded on the node and shown in the diff.
    type: str
notes:
  - The files are read on the controller, so the controller's copy of the collection is what the node runs.
"""

EXAMPLES = r"""
- name: Install the health agent's code
  gpufleet.reliability.node_code:
    entries: [cli/health_agent.py]
    src: "{{ role_path }}/../../plugins/module_utils"
    dest: /opt/gpufleet/lib/ansible_collections/gpufleet/reliability/plugins/module_utils
"""

RETURN = r"""
dest:
  description: The directory the files were installed under.
  returned: always
  type: str
files:
  description: Every file shipped, relative to RV(dest), sorted.
  returned: always
  type: list
  elements: str
  sample: [__init__.py, cli/__init__.py, cli/health_agent.py]
changed_files:
  description: The files written (or, in check mode, that would be written), or whose mode was set, relative to
    RV(dest).
  returned: always
  type: list
  elements: str
tree_sha256:
  description: The sha256 of the whole shipped tree (each path with its content's sha256).
  returned: always
  type: str
version:
  description: The collection version the files come from, as recorded on the node; null when it is not known.
  returned: always
  type: str
  sample: 0.1.1
previous:
  description: What the node's record said before this run (version, tree_sha256), or null when there was none
    (a first install, or a record that could not be read).
  returned: always
  type: dict
  sample: {version: 0.1.0, tree_sha256: 5f0c...}
record:
  description: The node's record of this set of entries, relative to RV(dest).
  returned: always
  type: str
  sample: .gpufleet-node-code/3e1f0a9b7c2d.json
created_directories:
  description: The directories created (or that would be created).
  returned: always
  type: list
  elements: str
"""

import hashlib
import json
import os
import re
import stat

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write


def octal(module, name):
    """The permission bits of option ``name``, or fail naming it."""
    text = str(module.params[name])
    try:
        value = int(text, 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o7777:
        module.fail_json(msg=f"{name}: expected an octal mode such as 0644, got {text!r}")
    return value


def relative(module, rel):
    """``rel`` if it is a plain relative path under dest, else fail naming it."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        module.fail_json(msg=f"files: expected plain relative paths under dest, got {rel!r}")
    return rel


RECORD_DIR = ".gpufleet-node-code"
RECORD_MAX = 65536  # a record is a few hundred bytes; anything larger is not ours
SHOWN = re.compile(r"[^0-9A-Za-z.+_-]")


def shown(value, limit=64):
    """A version or hash from the node's record, fit to print: only [0-9A-Za-z.+_-], at most ``limit`` long."""
    return SHOWN.sub("?", value)[:limit] if isinstance(value, str) else None


def read_record(path):
    """The node's record at ``path`` as {version, tree_sha256}, or None: missing, not a regular file, too large
    or not a record (it is then replaced)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > RECORD_MAX:
                return None
            data = json.loads(handle.read(RECORD_MAX))
        except (OSError, ValueError):
            return None
    if not isinstance(data, dict):
        return None
    return {"version": shown(data.get("version")), "tree_sha256": shown(data.get("tree_sha256"))}


def label(version, tree):
    return f"gpufleet node code {shown(version) or '(version unknown)'} (tree sha256 {tree[:16]})"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            entries=dict(type="list", elements="str", required=True),
            src=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            mode=dict(type="str", default="0644"),
            directory_mode=dict(type="str", default="0755"),
            files=dict(type="dict", required=True),
            version=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    dest = os.path.abspath(module.params["dest"])
    mode, dir_mode = octal(module, "mode"), octal(module, "directory_mode")
    files = {}
    for rel, text in module.params["files"].items():
        if not isinstance(text, str):
            module.fail_json(msg=f"files: expected the text of {rel!r}, got {type(text).__name__}")
        files[relative(module, rel)] = text.encode("utf-8", "surrogateescape")

    # dest, then every directory under it that holds a file, parents first
    dirs = {dest}
    for rel in files:
        parts = rel.split("/")[:-1]
        dirs.update(os.path.join(dest, *parts[:n]) for n in range(1, len(parts) + 1))
    created, chmod_dirs = [], []
    for path in sorted(dirs, key=lambda p: (p.count(os.sep), p)):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            created.append(path)
            continue
        if not stat.S_ISDIR(st.st_mode):
            module.fail_json(msg=f"dest: {path} exists and is not a directory")
        if stat.S_IMODE(st.st_mode) != dir_mode:
            chmod_dirs.append(path)

    write, chmod_files = [], []
    digest = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    tree = hashlib.sha256("".join(f"{r}\0{digest[r]}\n" for r in sorted(files)).encode()).hexdigest()
    version = module.params["version"]
    entries = sorted(module.params["entries"])
    record_rel = f"{RECORD_DIR}/{hashlib.sha256(chr(10).join(entries).encode()).hexdigest()[:12]}.json"
    record_path = os.path.join(dest, record_rel)
    record = (json.dumps({"version": version, "tree_sha256": tree, "entries": entries, "files": len(files)},
                         indent=1, sort_keys=True) + "\n").encode()
    previous = read_record(record_path)
    record_changed = previous != {"version": shown(version), "tree_sha256": tree}
    if os.path.join(dest, RECORD_DIR) not in dirs:
        try:
            st = os.lstat(os.path.join(dest, RECORD_DIR))
        except FileNotFoundError:
            created.append(os.path.join(dest, RECORD_DIR))
        else:
            if not stat.S_ISDIR(st.st_mode):
                module.fail_json(msg=f"dest: {os.path.join(dest, RECORD_DIR)} exists and is not a directory")
            if stat.S_IMODE(st.st_mode) != dir_mode:
                chmod_dirs.append(os.path.join(dest, RECORD_DIR))
    before_lines, after_lines = [], []  # the diff: one manifest line per file (mode, sha256, path), not its source
    for rel in sorted(files):
        path = os.path.join(dest, rel)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        old = None  # missing, or a link (replaced by a file, never followed)
        if st is not None and stat.S_ISDIR(st.st_mode):
            module.fail_json(msg=f"files: {path} exists and is a directory")
        if st is not None and stat.S_ISREG(st.st_mode):
            with open(path, "rb") as handle:
                old = handle.read()
        if module._diff:
            before_lines.append(f"absent {'-' * 16}  {rel}" if old is None or st is None else
                                f"{stat.S_IMODE(st.st_mode):04o} {hashlib.sha256(old).hexdigest()[:16]}  {rel}")
            after_lines.append(f"{mode:04o} {digest[rel][:16]}  {rel}")
        if old != files[rel]:
            write.append(rel)
        elif st is not None and stat.S_IMODE(st.st_mode) != mode:
            chmod_files.append(rel)

    changed = bool(created or chmod_dirs or write or chmod_files or record_changed)
    if changed and not module.check_mode:
        for path in created:
            os.makedirs(path, exist_ok=True)
        for path in created + chmod_dirs:
            os.chmod(path, dir_mode)
        for rel in write:
            atomic_write(os.path.join(dest, rel), files[rel], mode)
        for rel in chmod_files:
            os.chmod(os.path.join(dest, rel), mode)
        if record_changed:  # last: a run that stopped half-way leaves the old record, and the next run writes again
            atomic_write(record_path, record, 0o644)

    result = dict(changed=changed, dest=dest, files=sorted(files), changed_files=sorted(write + chmod_files),
                  created_directories=created, tree_sha256=tree, version=version, previous=previous,
                  record=record_rel)
    if module._diff and changed:
        before = label(previous["version"], previous["tree_sha256"] or "-") if previous else \
            "gpufleet node code: none recorded"
        result["diff"] = {"before_header": f"{dest}: {before}", "after_header": f"{dest}: {label(version, tree)}",
                          "before": f"# {before}\n" + "".join(f"{d}/ directory absent\n" for d in created)
                          + "".join(ln + "\n" for ln in before_lines),
                          "after": f"# {label(version, tree)}: {len(files)} files (mode, sha256, path)\n"
                          + "".join(ln + "\n" for ln in after_lines)}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
