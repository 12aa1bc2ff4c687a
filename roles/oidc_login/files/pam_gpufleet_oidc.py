# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pam_python entry file for gpufleet OIDC logins (Debian/Ubuntu libpam-python, Python 3).

PAM line (sshd only, never common-auth):

  auth [success=done default=die] /lib/security/pam_python.so /opt/gpufleet-oidc/pam_gpufleet_oidc.py \
      config=/etc/gpufleet/oidc.yml lib=/opt/gpufleet-oidc/lib \
      site=/opt/gpufleet-oidc/venv/lib/python3.11/site-packages mode=device

``lib=`` holds the collection's code the role copies (``ansible_collections/gpufleet/reliability/plugins/module_utils``:
``oidc/`` and what it imports),
``site=`` the venv with authlib, joserfc, cryptography and PyYAML; both go in front of sys.path.
pam_python runs this file in sshd's process with the system interpreter; every failure returns
a PAM error code (an exception would become PAM_SERVICE_ERR).
"""
import sys


def _paths(argv):
    for a in argv[1:]:
        for key in ("site=", "lib="):
            if a.startswith(key):
                p = a[len(key):]
                if p and p not in sys.path:
                    sys.path.insert(0, p)


def pam_sm_authenticate(pamh, flags, argv):
    try:
        _paths(argv)
        from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.pam import authenticate
    except Exception:
        return pamh.PAM_SERVICE_ERR
    return authenticate(pamh, argv)


def pam_sm_setcred(pamh, flags, argv):
    return pamh.PAM_SUCCESS


def pam_sm_acct_mgmt(pamh, flags, argv):
    return pamh.PAM_IGNORE


def pam_sm_open_session(pamh, flags, argv):
    return pamh.PAM_IGNORE


def pam_sm_close_session(pamh, flags, argv):
    return pamh.PAM_IGNORE


def pam_sm_chauthtok(pamh, flags, argv):
    return pamh.PAM_IGNORE
