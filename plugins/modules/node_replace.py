# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_replace
short_description: Ask the site's replacement (or re-image) hook to replace a node, idempotently
version_added: "0.1.0"
description:
  - The repair ladder's last rungs - re-image and replace - are site specific (a ticket, a cloud API, a
    provisioning system). This module calls a configured hook, either a command or an HTTP webhook, with a JSON
    request that carries an idempotency key, and retries failures.
  - "The request is C({\"action\", \"node\", \"incident\", \"idempotency_key\", \"reason\"}): on the command's stdin
    (with the same fields also in C(GPUFLEET_*) environment variables), or as the body of a POST to O(url) with an
    C(Idempotency-Key) header."
  - A successful call is recorded under O(state_dir) by its key; calling again with the same key changes nothing and
    returns the recorded answer, so a re-run after a crash never files a second replacement.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes.no_diff
options:
  node:
    description: Node to replace.
    type: str
    required: true
  action:
    description: What the hook is asked to do.
    type: str
    choices: [replace, reimage]
    default: replace
  incident:
    description: Incident id from the repair plan.
    type: str
    default: "-"
  idempotency_key:
    description: Key that identifies this request; the repair plan's C(hook.idempotency_key).
    type: str
    required: true
  reason:
    description: Why, for the person or system on the other end.
    type: str
    default: ""
  command:
    description:
      - Hook command as an argument list (no shell). Exit status 0 is success; its stdout (JSON if it parses) is
        returned. Mutually exclusive with O(url).
    type: list
    elements: str
  url:
    description:
      - Webhook URL; the request is POSTed as JSON. A 2xx answer is success. Mutually exclusive with O(command).
    type: str
  headers:
    description:
      - Extra HTTP headers for O(url) (for example an authorization token).
      - The values are C(no_log) - never logged, and masked wherever they would appear in the module's output.
    type: dict
    default: {}
  retries:
    description: Attempts after the first one fails.
    type: int
    default: 3
  delay:
    description: Seconds between attempts (doubles each time).
    type: float
    default: 2
  timeout:
    description: Seconds one attempt may take.
    type: int
    default: 30
  state_dir:
    description: Directory where successful calls are recorded by idempotency key.
    type: path
    default: /var/lib/gpufleet/hooks
  validate_certs:
    description: Verify TLS certificates for O(url).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: File a replacement through the site's hook
  gpufleet.reliability.node_replace:
    node: gpu017
    incident: "3"
    idempotency_key: "{{ decision.hook.idempotency_key }}"
    reason: "{{ decision.reason }}"
    url: https://rma.example.com/api/replacements
    headers:
      Authorization: "Bearer {{ rma_token }}"
"""

RETURN = r"""
response:
  description: The hook's answer (parsed JSON, or text).
  returned: success
  type: raw
attempts:
  description: Attempts made in this run (0 when the key was already recorded).
  returned: always
  type: int
recorded:
  description: Path of the record of the successful call.
  returned: success and not check mode
  type: str
"""

import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write

_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _parse(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def main():
    module = AnsibleModule(
        argument_spec=dict(
            node=dict(type="str", required=True),
            action=dict(type="str", choices=["replace", "reimage"], default="replace"),
            incident=dict(type="str", default="-"),
            idempotency_key=dict(type="str", required=True, no_log=False),
            reason=dict(type="str", default=""),
            command=dict(type="list", elements="str"),
            url=dict(type="str"),
            headers=dict(type="dict", default={}, no_log=True),
            retries=dict(type="int", default=3),
            delay=dict(type="float", default=2),
            timeout=dict(type="int", default=30),
            state_dir=dict(type="path", default="/var/lib/gpufleet/hooks"),
            validate_certs=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("command", "url")],
        required_one_of=[("command", "url")],
        supports_check_mode=True,
    )
    p = module.params
    key = p["idempotency_key"]
    if not _KEY.match(key):
        module.fail_json(msg=f"idempotency_key: expected 1-128 characters of letters, digits and ._:-, got {key!r}")
    if p["retries"] < 0:
        module.fail_json(msg=f"retries: expected an integer >= 0, got {p['retries']}")
    record = os.path.join(p["state_dir"], key + ".json")
    if os.path.exists(record):
        try:
            with open(record) as fh:
                done = json.load(fh)
        except (OSError, ValueError) as exc:
            module.fail_json(msg=f"state_dir: cannot read the record {record}: {exc}")
        module.exit_json(changed=False, attempts=0, response=done.get("response"), recorded=record,
                         msg=f"{p['action']} of {p['node']} already requested (key {key})")
    request = {"action": p["action"], "node": p["node"], "incident": p["incident"], "idempotency_key": key,
               "reason": p["reason"]}
    if module.check_mode:
        module.exit_json(changed=True, attempts=0, msg=f"would call the {p['action']} hook for {p['node']}")

    errors = []
    delay = p["delay"]
    response = None
    ok = False
    attempts = 0
    for attempt in range(p["retries"] + 1):
        attempts = attempt + 1
        if p["command"]:
            env = {"GPUFLEET_" + k.upper(): str(v) for k, v in request.items()}
            rc, out, err = module.run_command(p["command"], data=json.dumps(request), environ_update=env,
                                              binary_data=True)
            if rc == 0:
                response, ok = _parse(out), True
                break
            errors.append(f"attempt {attempts}: rc={rc}: {(err or out).strip()[:500]}")
        else:
            headers = {"Content-Type": "application/json", "Idempotency-Key": key}
            headers.update(p["headers"] or {})
            try:
                resp = open_url(p["url"], data=json.dumps(request), headers=headers, method="POST",
                                timeout=p["timeout"], validate_certs=p["validate_certs"])
                body = resp.read().decode("utf-8", "replace")
                if 200 <= resp.status < 300:
                    response, ok = _parse(body), True
                    break
                errors.append(f"attempt {attempts}: HTTP {resp.status}: {body[:500]}")
            except Exception as exc:  # noqa: BLE001 - HTTPError, URLError, socket errors all mean "retry"
                errors.append(f"attempt {attempts}: {type(exc).__name__}: {str(exc)[:500]}")
        if attempt < p["retries"]:
            time.sleep(delay)
            delay *= 2
    if not ok:
        module.fail_json(msg=f"{p['action']} hook for {p['node']} failed after {attempts} attempt(s)",
                         errors=errors, attempts=attempts)
    try:
        os.makedirs(p["state_dir"], mode=0o700, exist_ok=True)
        atomic_write(record, json.dumps({"request": request, "response": response, "at": time.time()},
                                        sort_keys=True), 0o600)
    except OSError as exc:
        module.fail_json(msg=f"hook succeeded but recording it in {p['state_dir']} failed: {exc}", response=response,
                         attempts=attempts)
    module.exit_json(changed=True, attempts=attempts, response=response, recorded=record, errors=errors,
                     msg=f"{p['action']} of {p['node']} requested")


if __name__ == "__main__":
    main()
