# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action of gpufleet.reliability.node_code: derive the files on the controller, send them in one module run."""
from __future__ import annotations

import os

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
        res = self._execute_module(module_name="gpufleet.reliability.node_code", module_args=dict(args, files=files),
                                   task_vars=task_vars)
        res.pop("invocation", None)  # the module's arguments are the files' text: not worth echoing back
        result.update(res)
        return result
