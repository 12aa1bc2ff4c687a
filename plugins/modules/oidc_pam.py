# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: oidc_pam
short_description: Validated OIDC login configuration and the PAM include for sshd
version_added: "0.1.0"
description:
  - Validates the OIDC settings (issuer, audience, claims, group gate, algorithms, cache) with the same code the
    login module uses, and writes them to O(config_path) (mode 0600). A bad setting is refused with a message that
    names the key; nothing is changed.
  - Writes the PAM include file O(include_path) with one C(auth) line for C(pam_python.so) and the gpufleet entry
    file, with the control C([success=done default=die]) so that a failed OIDC login never falls through to
    another method.
  - Adds C(@include <include file>) to the sshd PAM stack O(service_path) before its first C(@include common-auth)
    (or its first C(auth) line). Only sshd stacks are accepted (the file name must start with C(sshd)); the
    module refuses C(common-auth) and other shared stacks because sudo, su, cron and display managers can never
    complete a device login.
  - All writes are atomic. O(state=absent) removes the include line, the include file and the configuration.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
options:
  config:
    description:
      - The OIDC settings, as in the YAML configuration file (see the C(gpufleet.reliability.oidc_login) role and
        C(docs/oidc.md)). At least C(issuer), C(audience), C(username_claim), C(groups_claim), C(allowed_groups)
        and C(jwks_cache_dir) (a preset can supply the claim names).
      - With C(preset=okta) or C(preset=entra), C(allowed_domains) must be set too (the domains whose
        C(user@domain) names map to C(user); C([]) when names carry no domain). C(min_uid) and C(max_uid)
        (default 1000 and 60000) bound the uid of the mapped local user, so system accounts are refused.
      - Required when O(state=present).
      - Secrets (C(client_secret), and a password in C(proxy)) are written to O(config_path) as given but are
        shown as C(VALUE_SPECIFIED_IN_NO_LOG_PARAMETER) in the module's result, its diff and the logged
        invocation. The option is C(no_log) so that the module never logs it whole when it starts; only the
        secrets are masked in what it returns.
    type: dict
  config_path:
    description: Where the validated configuration is written (as JSON, which is YAML).
    type: path
    default: /etc/gpufleet/oidc.yml
  include_path:
    description: The PAM include file; its directory must be the PAM configuration directory of O(service_path).
    type: path
    default: /etc/pam.d/gpufleet-oidc
  service_path:
    description: The sshd PAM stack that gets the C(@include) line. Its file name must start with C(sshd).
    type: path
    default: /etc/pam.d/sshd
  mode:
    description:
      - V(device) shows the verification URL and code in one prompt and polls the IdP (RFC 8628).
      - V(token) asks for an access token at the prompt (for oidc-agent and scripts; the OpenSSH client sends
        at most 1023 characters at a prompt).
    type: str
    choices: [device, token]
    default: device
  pam_python:
    description: Path of the pam_python module (Debian and Ubuntu install it in /lib/security).
    type: path
    default: /lib/security/pam_python.so
  entry:
    description: The pam_python entry file (C(pam_gpufleet_oidc.py)) installed on the node.
    type: path
    default: /opt/gpufleet-oidc/pam_gpufleet_oidc.py
  lib_dir:
    description:
      - Directory that holds the collection's code the oidc_login role copies
        (C(ansible_collections/gpufleet/reliability/plugins/module_utils/) with C(oidc/) and what it imports).
    type: path
    default: /opt/gpufleet-oidc/lib
  site_dir:
    description: site-packages of the virtual environment with authlib, joserfc, cryptography and PyYAML.
    type: path
  debug_log:
    description: Log file of the PAM module (one line per login with the reason; tokens are never logged).
    type: path
  state:
    description: V(present) installs, V(absent) removes.
    type: str
    choices: [present, absent]
    default: present
notes:
  - The module does not touch sshd_config; the C(gpufleet.reliability.oidc_login) role does, and runs
    C(sshd -t) before any reload.
seealso:
  - name: OIDC logins
    description: Design, IdP presets, PAM and sshd wiring, Slurm REST.
    link: https://github.com/gpufleet/reliability/blob/main/docs/oidc.md
"""

EXAMPLES = r"""
- name: OIDC device login for sshd
  gpufleet.reliability.oidc_pam:
    config:
      preset: keycloak
      issuer: https://sso.example.com/realms/hpc
      audience: hpc-login
      username_claim: preferred_username
      groups_claim: groups
      allowed_groups: [hpc-users]
      jwks_cache_dir: /var/cache/gpufleet-oidc
      client_id: hpc-login
      scope: openid profile groups
    mode: device
    site_dir: /opt/gpufleet-oidc/venv/lib/python3.11/site-packages
"""

RETURN = r"""
config:
  description:
    - The configuration as written (validated, with preset defaults resolved into it only as given).
    - Secrets (C(client_secret), a password in C(proxy)) are replaced by C(VALUE_SPECIFIED_IN_NO_LOG_PARAMETER).
  returned: when state is present
  type: dict
  sample: {issuer: "https://sso.example.com/realms/hpc", audience: hpc-login}
pam_line:
  description: The auth line of the include file.
  returned: when state is present
  type: str
  sample: "auth [success=done default=die] /lib/security/pam_python.so /opt/gpufleet-oidc/pam_gpufleet_oidc.py ..."
files:
  description: The files the module manages.
  returned: always
  type: list
  elements: str
  sample: [/etc/gpufleet/oidc.yml, /etc/pam.d/gpufleet-oidc, /etc/pam.d/sshd]
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.gpufleet.reliability.plugins.module_utils.diff import file_changes
from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import (
    parse_config,
    redact_config,
    secret_values,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import ConfigError

MARK = "# gpufleet-oidc (managed by gpufleet.reliability.oidc_pam)"
SHARED_STACKS = re.compile(r"^(common-.*|system-auth|password-auth|sudo.*|su|su-l|login|cron.*|gdm.*|lightdm.*)$")


def read_text(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def render_config(config):
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def shown_config(text):
    """The configuration file as the diff shows it: with its secrets replaced (the file itself keeps them)."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return "(content not shown: not the JSON this module writes, and it may hold secrets)\n"
    return render_config(redact_config(data))


def pam_line(p):
    args = [f"config={p['config_path']}", f"lib={p['lib_dir']}"]
    if p["site_dir"]:
        args.append(f"site={p['site_dir']}")
    if p["debug_log"]:
        args.append(f"debug_log={p['debug_log']}")
    args.append(f"mode={p['mode']}")
    for a in args:
        if re.search(r"\s", a):
            raise ValueError(f"PAM module arguments cannot contain white space: {a!r}")
    return f"auth [success=done default=die] {p['pam_python']} {p['entry']} {' '.join(args)}"


def with_include(stack, include_name):
    lines = [ln for ln in stack.splitlines() if ln.strip() != MARK and ln.strip() != f"@include {include_name}"]
    new = [MARK, f"@include {include_name}"]
    for i, ln in enumerate(lines):
        s = ln.strip()
        if s == "@include common-auth" or re.match(r"^-?auth\s", s):
            return "\n".join(lines[:i] + new + lines[i:]) + "\n"
    return "\n".join(new + lines) + "\n"


def without_include(stack, include_name):
    lines = [ln for ln in stack.splitlines() if ln.strip() != MARK and ln.strip() != f"@include {include_name}"]
    return "\n".join(lines) + ("\n" if lines else "")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="dict", no_log=True),
            config_path=dict(type="path", default="/etc/gpufleet/oidc.yml"),
            include_path=dict(type="path", default="/etc/pam.d/gpufleet-oidc"),
            service_path=dict(type="path", default="/etc/pam.d/sshd"),
            mode=dict(type="str", choices=["device", "token"], default="device"),
            pam_python=dict(type="path", default="/lib/security/pam_python.so"),
            entry=dict(type="path", default="/opt/gpufleet-oidc/pam_gpufleet_oidc.py"),
            lib_dir=dict(type="path", default="/opt/gpufleet-oidc/lib"),
            site_dir=dict(type="path"),
            debug_log=dict(type="path"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        required_if=[("state", "present", ("config",))],
        supports_check_mode=True,
    )
    p = module.params
    # config is no_log so that AnsibleModule never logs it whole (its "Invoked with" journal line); in what the
    # module returns, mask only the secrets in it (config is the only no_log option), not every setting's value.
    module.no_log_values.clear()
    module.no_log_values.update(secret_values(p["config"]))
    svc = os.path.basename(p["service_path"])
    if not svc.startswith("sshd") or SHARED_STACKS.match(svc):
        module.fail_json(msg=f"oidc_pam: service_path {p['service_path']}: only an sshd PAM stack (a file named "
                             "sshd*) may load the OIDC module, never common-auth or other shared stacks")
    if os.path.dirname(p["include_path"]) != os.path.dirname(p["service_path"]):
        module.fail_json(msg="oidc_pam: include_path must be in the same directory as service_path "
                             "(@include is resolved in the PAM configuration directory)")
    include_name = os.path.basename(p["include_path"])
    files = [p["config_path"], p["include_path"], p["service_path"]]
    result = dict(changed=False, files=files)
    stack = read_text(p["service_path"])
    if stack is None:
        module.fail_json(msg=f"oidc_pam: service_path {p['service_path']} does not exist (is openssh-server "
                             "installed?)")

    wanted = {}
    if p["state"] == "present":
        try:
            parse_config(p["config"])
        except ConfigError as exc:
            module.fail_json(msg=f"oidc_pam: invalid OIDC configuration: {exc}", key=exc.key)
        try:
            line = pam_line(p)
        except ValueError as exc:
            module.fail_json(msg=f"oidc_pam: {exc}")
        result["config"] = redact_config(p["config"])
        result["pam_line"] = line
        wanted[p["config_path"]] = (render_config(p["config"]), 0o600)
        wanted[p["include_path"]] = (
            "# gpufleet OIDC login (managed by gpufleet.reliability.oidc_pam). Included from sshd only.\n"
            + line + "\n", 0o644)
        wanted[p["service_path"]] = (with_include(stack, include_name), None)
    else:
        wanted[p["service_path"]] = (without_include(stack, include_name), None)
        wanted[p["include_path"]] = (None, None)
        wanted[p["config_path"]] = (None, None)

    diffs, writes = [], []
    for path in (p["config_path"], p["include_path"], p["service_path"]):
        new, mode = wanted[path]
        old = stack if path == p["service_path"] else read_text(path)
        shown = shown_config if path == p["config_path"] else None
        if new is None:
            if old is not None:
                writes.append((path, None, None))
                diffs += file_changes(path, old, None, shown=shown)
            continue
        if mode is None:
            mode = os.stat(path).st_mode & 0o7777
        cur_mode = (os.stat(path).st_mode & 0o7777) if old is not None else None
        if old != new or cur_mode != mode:
            writes.append((path, new, mode))
            diffs += file_changes(path, old, new, cur_mode, mode, shown=shown)
    if writes:
        result["changed"] = True
        result["diff"] = diffs
        if not module.check_mode:
            try:
                for path, text, mode in writes:
                    if text is None:
                        os.unlink(path)
                    else:
                        atomic_write(path, text, mode, makedirs=True)
            except OSError as exc:
                module.fail_json(msg=f"oidc_pam: cannot write {exc.filename}: {to_native(exc)}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
