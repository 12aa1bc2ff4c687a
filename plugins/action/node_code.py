# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action of gpufleet.reliability.node_code: derive the files on the controller, send them in one module run."""
from __future__ import annotations

import json
import os

import yaml
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.reliability.plugins.filter.node_files import NodeFilesError, node_files

ARGUMENT_SPEC = dict(
    entries=dict(type="list", elements="str", required=True),
    src=dict(type="path", required=True),
    dest=dict(type="str", required=True),  # a path on the node: not expanded here
    mode=dict(type="str", default="0644"),
    directory_mode=dict(type="str", default="0755"),
)


def collection_version(src):
    """The version of the collection whose ``plugins/module_utils`` is ``src``: from MANIFEST.json (an installed
    collection) or galaxy.yml (a checkout), or None when neither is there or names one."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(src)))
    try:
        with open(os.path.join(root, "MANIFEST.json"), encoding="utf-8") as handle:
            version = (json.load(handle).get("collection_info") or {}).get("version")
    except (OSError, ValueError, AttributeError):
        try:
            with open(os.path.join(root, "galaxy.yml"), encoding="utf-8") as handle:
                version = (yaml.safe_load(handle) or {}).get("version")
        except (OSError, yaml.YAMLError, AttributeError):
            version = None
    return str(version) if isinstance(version, (str, int, float)) and str(version) else None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        try:
            rels = node_files(args["entries"], args["src"])
        except NodeFilesError as err:
            raise AnsibleActionFail(f"entries: {err}") from err
        files = {}
        for rel in rels:
            path = os.path.join(args["src"], rel)
            try:
                with open(path, encoding="utf-8") as handle:
                    files[rel.replace(os.sep, "/")] = handle.read()
            except (OSError, UnicodeDecodeError) as err:
                raise AnsibleActionFail(f"src: cannot read {path}: {err}") from err
        module_args = dict(args, files=files, version=collection_version(args["src"]))
        res = self._execute_module(module_name="gpufleet.reliability.node_code", module_args=module_args,
                                   task_vars=task_vars)
        res.pop("invocation", None)  # the module's arguments are the files' text: not worth echoing back
        result.update(res)
        return result
