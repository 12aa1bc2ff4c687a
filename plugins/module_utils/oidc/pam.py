# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PAM glue for pam_python (``pamh`` is libpam_python's PamHandle; nothing here imports it).

Module arguments (``key=value`` after the entry file on the PAM line):

* ``config=`` YAML configuration (required);
* ``mode=device`` (default) or ``mode=token``;
* ``debug_log=`` log file (the environment is scrubbed inside sshd, so no env vars).

``PAM_SUCCESS`` is returned only after a validated, authorised token for the PAM user. Every
other path fails closed: ``PAM_AUTH_ERR`` (bad token, not authorised, denied, timed out),
``PAM_AUTHINFO_UNAVAIL`` (IdP unreachable and no cache), ``PAM_CONV_ERR`` (the conversation
failed), ``PAM_USER_UNKNOWN`` (no user), ``PAM_SERVICE_ERR`` (bad configuration or a bug).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

from .config import load_config
from .core import Authenticator, file_logger
from .device import MAX_URI, MAX_USER_CODE, display_text
from .errors import OIDCError
from .transport import is_plain_ascii

TOKEN_PROMPT = "OIDC access token: "


def parse_args(argv: List[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for a in argv:
        k, sep, v = a.partition("=")
        out[k] = v if sep else "1"
    return out


def device_prompt(user: str, grant: Dict[str, Any]) -> str:
    """IdP-supplied text goes into the user's terminal: DeviceGrant.start checked it; cleaned again here."""
    url = display_text(grant.get("verification_uri_complete") or grant["verification_uri"], MAX_URI)
    return (f"To log in as {user}, open {url}\n"
            f"and confirm the code {display_text(grant['user_code'], MAX_USER_CODE)}.\n"
            "Press Enter here after you have approved: ")


def _code(pamh: Any, name: str) -> int:
    return int(getattr(pamh, name, pamh.PAM_AUTH_ERR))


def authenticate(pamh: Any, argv: List[str]) -> int:
    opts = parse_args(list(argv[1:]))
    log = file_logger(opts.get("debug_log"), "pam_gpufleet_oidc")
    mode = opts.get("mode", "device")
    started = time.monotonic()
    user = None
    try:
        if mode not in ("device", "token"):
            log(f"bad module argument mode={mode!r}")
            return _code(pamh, "PAM_SERVICE_ERR")
        if "config" not in opts:
            log("missing module argument config=")
            return _code(pamh, "PAM_SERVICE_ERR")
        try:
            user = pamh.get_user(None)
        except pamh.exception:
            log("no PAM user")
            return _code(pamh, "PAM_USER_UNKNOWN")
        if not user:
            return _code(pamh, "PAM_USER_UNKNOWN")
        if not is_plain_ascii(user):
            # the login name comes from the SSH client: never put it on a terminal, in a log or before the IdP
            log(f"refused login name {ascii(user)[:80]}: not plain ASCII")
            user = None
            return _code(pamh, "PAM_USER_UNKNOWN")
        cfg = load_config(opts["config"])
        if not opts.get("debug_log") and cfg.log_file:
            log = file_logger(cfg.log_file, "pam_gpufleet_oidc")
        auth = Authenticator(cfg, log=log)
        if mode == "token":
            try:
                resp = pamh.conversation(pamh.Message(pamh.PAM_PROMPT_ECHO_OFF, TOKEN_PROMPT))
            except pamh.exception:
                log(f"user={user} mode=token: conversation failed")
                return _code(pamh, "PAM_CONV_ERR")
            token = getattr(resp, "resp", None)
        else:
            dg = auth.device_grant()
            grant = dg.start()
            try:
                # One ECHO_ON prompt carries URL and code: sshd would hold a TEXT_INFO message back
                # until the next prompt, so the user would never see it in time.
                pamh.conversation(pamh.Message(pamh.PAM_PROMPT_ECHO_ON, device_prompt(user, grant)))
            except pamh.exception:
                log(f"user={user} mode=device: conversation failed")
                return _code(pamh, "PAM_CONV_ERR")
            tokens = dg.poll(grant, cfg.device_timeout, first_delay=0)
            token = auth.token_from_response(tokens)
            if not token:
                log(f"user={user} mode=device: token response has no {cfg.validate_token}")
                return _code(pamh, "PAM_AUTH_ERR")
        local, claims = auth.check_token(token, login_user=user)
        log(f"accepted user={local} sub={claims.get('sub')!r} mode={mode} "
            f"ms={int((time.monotonic() - started) * 1000)}")
        return _code(pamh, "PAM_SUCCESS")
    except OIDCError as e:
        log(f"rejected user={user} mode={mode}: {e.reason}")
        return _code(pamh, e.pam_result)
    except Exception as e:  # fail closed; pam_python would turn it into PAM_SERVICE_ERR anyway
        log(f"error user={user} mode={mode}: {type(e).__name__}: {str(e)[:200]}")
        return _code(pamh, "PAM_SERVICE_ERR")
