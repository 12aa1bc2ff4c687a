# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""RFC 8628 device authorization grant client on authlib's generic OAuth2Client.

authlib builds the token request body, does client authentication (basic / post / none) and
turns error responses into ``OAuth2Error``; the transport is :class:`http.UrllibSession`.
Polling honours ``interval`` (default 5 s, RFC 8628 section 3.2), adds 5 s on ``slow_down``
(section 3.5) and stops at the earlier of the code's ``expires_in`` and our own deadline.

Everything the IdP says ends up on the user's terminal (through sshd and PAM) or in a log, so a hostile or
compromised IdP is assumed: ``verification_uri`` and ``verification_uri_complete`` must be plain printable
ASCII and https (plain http only to loopback), else the response is refused (they may be on another host than
the issuer: Entra ID sends https://microsoft.com/devicelogin, Google https://www.google.com/device);
``user_code`` and ``message`` lose escape sequences and control characters and are bounded in length
(:func:`display_text`); the endpoints come from a discovery document whose origin was checked (jwks.py).
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable, Dict, Optional

from . import transport as http
from .errors import DeviceFlowError, IdPUnavailable

try:
    from authlib.oauth2.base import OAuth2Error
    from authlib.oauth2.client import OAuth2Client
    from authlib.oauth2.rfc8628 import DEVICE_CODE_GRANT_TYPE

    HAS_AUTHLIB = True
    AUTHLIB_IMPORT_ERROR = None
except ImportError as _e:  # pragma: no cover - exercised by ansible-test import sanity
    HAS_AUTHLIB = False
    AUTHLIB_IMPORT_ERROR = _e
    DEVICE_CODE_GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code"


#: ESC/CSI sequences (CSI ... final byte, OSC ... BEL or ST, two-byte ESC x) and the 8-bit CSI/OSC introducers.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?"
                      r"|\x9b[0-?]*[ -/]*[@-~]|\x9d[^\x07\x1b\x9c]*[\x07\x9c]?")
MAX_USER_CODE = 64
MAX_URI = 512
MAX_MESSAGE = 300


def display_text(text: Any, limit: int = MAX_MESSAGE) -> str:
    """IdP-supplied text made safe for a terminal: escape sequences removed whole, then every character that is
    not printable (C0/C1 controls, DEL, bidi and other format characters, line separators) dropped, then cut to
    ``limit`` characters."""
    text = _ESCAPES.sub("", str(text)[: limit * 8])
    return "".join(c for c in text if c.isprintable())[:limit]


def _plain_url(body: Dict[str, Any], key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not http.is_plain_ascii(v) or len(v) > MAX_URI or not http.is_secure_url(v):
        raise DeviceFlowError(f"device authorization response: {key} is not a plain https URL of at most "
                              f"{MAX_URI} characters: {ascii(v)[:80]}")
    return v


class DeviceGrant:
    def __init__(self, metadata: Dict[str, Any], client_id: str, client_secret: Optional[str] = None,
                 scope: str = "openid", resource: Optional[str] = None, http_timeout: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        if not HAS_AUTHLIB:
            raise DeviceFlowError(f"authlib is required for the device grant: {AUTHLIB_IMPORT_ERROR}")
        for k in ("device_authorization_endpoint", "token_endpoint"):
            if not isinstance(metadata.get(k), str):
                raise DeviceFlowError(f"the IdP does not advertise {k} (device grant unsupported)")
        self.meta = metadata
        self.resource = resource
        self.sleep = sleep
        self.clock = clock
        self.client = OAuth2Client(http.UrllibSession(timeout=http_timeout), client_id=client_id,
                                   client_secret=client_secret, scope=scope)
        #: number of token-endpoint polls and the final interval (for tests)
        self.polls = 0
        self.interval = 5.0

    def start(self) -> Dict[str, Any]:
        """Device authorization request. Returns the IdP's response (user_code, verification_uri, ...)."""
        c = self.client
        data = {"client_id": c.client_id, "scope": c.scope}
        if self.resource:
            data["resource"] = self.resource
        auth = c.client_auth(c.token_endpoint_auth_method)
        resp = c.session.post(self.meta["device_authorization_endpoint"], data=data, auth=auth)
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise IdPUnavailable(f"device authorization: HTTP {resp.status_code}, no JSON body")
        if "error" in body:
            # e.g. Entra AADSTS50199/53003 when Conditional Access blocks the device code flow
            raise DeviceFlowError(f"device authorization refused: {display_text(body.get('error'), 60)}: "
                                  f"{display_text(body.get('error_description', ''), 160)}")
        for k in ("device_code", "user_code", "verification_uri"):
            if not isinstance(body.get(k), str) or not body[k]:
                raise DeviceFlowError(f"device authorization response lacks {k}")
        _plain_url(body, "verification_uri")
        if body.get("verification_uri_complete") is not None:
            _plain_url(body, "verification_uri_complete")
        code = display_text(body["user_code"], MAX_USER_CODE + 1)
        if not code or len(code) > MAX_USER_CODE:
            raise DeviceFlowError(f"device authorization response: user_code is empty or longer than "
                                  f"{MAX_USER_CODE} characters")
        body["user_code"] = code
        if "message" in body:
            body["message"] = display_text(body["message"])
        iv = body.get("interval", 5)
        body["interval"] = iv if isinstance(iv, (int, float)) and not isinstance(iv, bool) and iv > 0 else 5
        ex = body.get("expires_in", 600)
        body["expires_in"] = ex if isinstance(ex, (int, float)) and not isinstance(ex, bool) and ex > 0 else 600
        return body

    def poll(self, grant: Dict[str, Any], timeout: float, first_delay: float = 0.0) -> Dict[str, Any]:
        """Poll the token endpoint until a token, a terminal error or the deadline."""
        started = self.clock()
        deadline = started + min(float(timeout), float(grant["expires_in"]))
        self.interval = float(grant["interval"])
        delay = first_delay
        while True:
            if self.clock() + delay > deadline:
                raise DeviceFlowError("device login timed out before approval")
            if delay:
                self.sleep(delay)
            self.polls += 1
            kw = {"device_code": grant["device_code"]}
            if self.resource:
                kw["resource"] = self.resource
            try:
                return self.client.fetch_token(self.meta["token_endpoint"], grant_type=DEVICE_CODE_GRANT_TYPE,
                                               **kw)
            except OAuth2Error as e:
                err = e.error
                if err == "authorization_pending":
                    delay = self.interval
                    continue
                if err == "slow_down":
                    self.interval += 5
                    delay = self.interval
                    continue
                if err == "access_denied":
                    raise DeviceFlowError("device login denied by the user")
                if err == "expired_token":
                    raise DeviceFlowError("device code expired before approval")
                raise DeviceFlowError(f"device grant failed: {display_text(err, 60)}")
            except http.HTTPStatusError as e:
                raise IdPUnavailable(f"token endpoint error: HTTP {e.status}")
            except ValueError as e:
                raise IdPUnavailable(f"token endpoint answered without JSON: {e}"[:200])
