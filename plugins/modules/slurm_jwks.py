# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_jwks
short_description: Sync an OpenID provider's JWKS into a file Slurm's auth/jwt plugin can use
version_added: "0.1.0"
description:
  - Fetches the public signing keys of an OpenID provider (from O(jwks_uri), or through the discovery document of
    O(issuer), whose C(issuer) must match exactly) and writes them to O(dest) in the form Slurm's C(auth/jwt)
    plugin needs for C(AuthAltParameters=jwks=...).
  - Normalisation for Slurm - only RSA signature keys that have a C(kid) are kept; every key gets
    C(alg) set to C(RS256) (Slurm 22.05 skips keys without it and Entra ID publishes none); only C(kty), C(kid),
    C(use), C(alg), C(n) and C(e) are kept (no C(x5c)); keys are sorted by C(kid) so the file only changes when
    the keys do.
  - The file is written atomically and only when its content, owner, group or mode differ.
  - Slurm checks only the signature and C(exp) of such tokens (no C(iss), no C(aud)); put only the keys of an IdP
    realm or tenant dedicated to the cluster in this file.
author:
  - gpufleet.reliability contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.reliability.attributes
options:
  issuer:
    description: The OpenID provider's issuer URL. One of O(issuer) and O(jwks_uri) is required.
    type: str
  jwks_uri:
    description: The JWKS URL (skips discovery).
    type: str
  dest:
    description: The JWKS file Slurm reads.
    type: path
    required: true
  owner:
    description: Owner of O(dest) (the SlurmUser).
    type: str
  group:
    description: Group of O(dest).
    type: str
  mode:
    description: Octal mode of O(dest). Slurm 23.11 and later refuse a file writable by others.
    type: str
    default: "0400"
  timeout:
    description: HTTP timeout in seconds.
    type: int
    default: 10
"""

EXAMPLES = r"""
- name: Keys of the cluster's Keycloak realm for slurmctld and slurmrestd
  gpufleet.reliability.slurm_jwks:
    issuer: https://sso.example.com/realms/hpc
    dest: /etc/slurm/jwks.json
    owner: slurm
    group: slurm
  register: jwks
"""

RETURN = r"""
kids:
  description: The key ids written.
  returned: success
  type: list
  elements: str
  sample: [rs-1]
"""

import grp
import json
import os
import pwd

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.reliability.plugins.module_utils.diff import change, file_changes
from ansible_collections.gpufleet.reliability.plugins.module_utils.fileutil import atomic_write
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import OIDCError
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.slurm import (
    fetch_jwks,
    normalise_jwks_for_slurm,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            issuer=dict(type="str"),
            jwks_uri=dict(type="str"),
            dest=dict(type="path", required=True),
            owner=dict(type="str"),
            group=dict(type="str"),
            mode=dict(type="str", default="0400"),
            timeout=dict(type="int", default=10),
        ),
        required_one_of=[("issuer", "jwks_uri")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        mode = int(p["mode"], 8)
    except ValueError:
        module.fail_json(msg=f"slurm_jwks: mode {p['mode']!r} is not an octal mode such as '0400'")
    if mode & 0o002:
        module.fail_json(msg="slurm_jwks: mode must not make the JWKS writable by others (Slurm refuses it)")
    try:
        uid = pwd.getpwnam(p["owner"]).pw_uid if p["owner"] else -1
        gid = grp.getgrnam(p["group"]).gr_gid if p["group"] else -1
    except KeyError as exc:
        module.fail_json(msg=f"slurm_jwks: unknown owner or group: {exc}")
    try:
        jwks = normalise_jwks_for_slurm(fetch_jwks(p["issuer"], p["jwks_uri"], p["timeout"]))
    except OIDCError as exc:
        module.fail_json(msg=f"slurm_jwks: {exc.reason}")
    if not jwks["keys"]:
        module.fail_json(msg="slurm_jwks: the IdP publishes no RSA signing key with a kid; Slurm's auth/jwt "
                             "only verifies RS256")
    new = json.dumps(jwks, indent=2, sort_keys=True) + "\n"
    dest = p["dest"]
    old = None
    st = None
    try:
        with open(dest, encoding="utf-8") as fh:
            old = fh.read()
        st = os.stat(dest)
    except FileNotFoundError:
        pass
    try:
        old_obj = json.loads(old) if old is not None else None
    except ValueError:
        old_obj = None
    content_changed = old_obj != jwks
    meta_changed = st is not None and ((st.st_mode & 0o7777) != mode or (uid != -1 and st.st_uid != uid)
                                       or (gid != -1 and st.st_gid != gid))
    result = dict(changed=content_changed or meta_changed, kids=[k["kid"] for k in jwks["keys"]], dest=dest)
    if result["changed"]:
        diffs = file_changes(dest, old, new if content_changed else old, st.st_mode if st else None, mode)
        if st is not None:
            owner = (uid if uid != -1 else st.st_uid, gid if gid != -1 else st.st_gid)
            if owner != (st.st_uid, st.st_gid):
                diffs.append(change(f"{dest} (owner)", f"{st.st_uid}:{st.st_gid}\n", f"{owner[0]}:{owner[1]}\n"))
        result["diff"] = diffs
        if not module.check_mode:
            try:
                if content_changed:
                    atomic_write(dest, new, mode)  # the text the diff shows
                os.chmod(dest, mode)
                if uid != -1 or gid != -1:
                    os.chown(dest, uid, gid)
            except OSError as exc:
                module.fail_json(msg=f"slurm_jwks: cannot write {dest}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
