# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small HTTP transport on the standard library (no requests/httpx needed on login nodes).

``UrllibSession`` offers the subset of the requests.Session interface that authlib's generic
``OAuth2Client`` uses (``post``/``request`` returning an object with ``status_code``, ``json()``
and ``raise_for_status()``), so authlib does the OAuth parts (client authentication, token
request bodies, error parsing) while this module only moves bytes.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPMessage
from typing import IO, Any, Dict, Optional, Tuple

from .errors import IdPUnavailable

MAX_BODY = 1024 * 1024  # 1 MiB is far more than any discovery document, JWKS or token response

#: Plain http is accepted only to a loopback address (tests, a local relay); everything else must be https.
_LOOPBACK_HTTP = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?(/|$)")


_PLAIN_ASCII = re.compile(r"[\x21-\x7e]+")


def is_plain_ascii(text: Any) -> bool:
    """True for a non-empty string of printable ASCII without spaces. The one copy of this rule: identities (user
    names, user_map, domains) and every URL taken from an IdP must pass it."""
    return isinstance(text, str) and bool(_PLAIN_ASCII.fullmatch(text))


def json_loads(raw: Any) -> Any:
    """``json.loads`` for text from outside (IdP answers, token parts, the cache file): every failure, including
    ``RecursionError`` from JSON nested thousands deep and bytes that are not UTF-8, is a ``ValueError``."""
    try:
        if isinstance(raw, (bytes, bytearray)):
            raw = bytes(raw).decode("utf-8")
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8: {e.reason}")


def is_secure_url(url: Any) -> bool:
    """True for an https URL, or a plain http URL to a loopback address. The one copy of this rule."""
    return isinstance(url, str) and (url.startswith("https://") or bool(_LOOPBACK_HTTP.match(url)))


def _origin(url: str) -> Tuple[str, Optional[str], Optional[int]]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.hostname, parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower())


def require_same_origin(url: Any, base: str, what: str) -> str:
    """Return ``url`` if it is a plain-ASCII :func:`is_secure_url` on the same scheme, host and port as ``base``
    (the issuer), else raise :class:`IdPUnavailable`: a hostile discovery document must not send client secrets,
    device codes or key fetches to another host, or from an https issuer to a loopback port any local user can
    listen on."""
    ok = is_plain_ascii(url) and len(url) <= 2048 and is_secure_url(url)
    try:
        ok = ok and _origin(url) == _origin(base)
    except ValueError:  # a port that is not a number
        ok = False
    if not ok:
        raise IdPUnavailable(f"{what} {ascii(url)[:100]} leaves the issuer's origin {ascii(base)[:100]} (expected "
                             "the same scheme, host and port)")
    return url


def require_secure_url(url: Any, what: str) -> str:
    """Return ``url`` if :func:`is_secure_url`, else raise :class:`IdPUnavailable` naming it and the rule."""
    if not is_secure_url(url):
        raise IdPUnavailable(f"{what} {str(url)[:100]!r} is not https (expected https://, or plain http only to "
                             "a loopback address: 127.0.0.1, localhost or [::1])")
    return url


class HTTPStatusError(Exception):
    def __init__(self, status: int, url: str):
        super().__init__(f"HTTP {status} from {url}")
        self.status = status


class Response:
    def __init__(self, status_code: int, body: bytes, url: str):
        self.status_code = status_code
        self.content = body
        self.url = url

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json_loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise HTTPStatusError(self.status_code, self.url)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,  # noqa: D401
                         headers: HTTPMessage, newurl: str) -> Optional[urllib.request.Request]:  # urllib API
        return None


_OPENER = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


def configure(proxy: Optional[str] = None) -> None:
    """Use ``proxy`` (http://host:port) for IdP requests. Environment proxies are never used: sshd scrubs the
    environment, and a login must not depend on whoever started the process."""
    global _OPENER
    handler = urllib.request.ProxyHandler({"http": proxy, "https": proxy} if proxy else {})
    _OPENER = urllib.request.build_opener(_NoRedirect, handler)


def request(method: str, url: str, data: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None,
            timeout: float = 5.0) -> Response:
    """One HTTP request. Network failures raise :class:`IdPUnavailable`; HTTP errors return a Response."""
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(MAX_BODY + 1)[:MAX_BODY], url)
    except urllib.error.HTTPError as e:
        try:
            body = e.read(MAX_BODY)
        except Exception:
            body = b""
        return Response(e.code, body, url)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise IdPUnavailable(f"cannot reach {url}: {reason}")


def get_json(url: str, timeout: float = 5.0) -> Any:
    resp = request("GET", url, headers={"Accept": "application/json"}, timeout=timeout)
    if resp.status_code != 200:
        raise IdPUnavailable(f"HTTP {resp.status_code} from {url}")
    try:
        return resp.json()
    except ValueError:
        raise IdPUnavailable(f"response from {url} is not JSON")


class UrllibSession:
    """The part of requests.Session that authlib.oauth2.client.OAuth2Client calls."""

    def __init__(self, timeout: float = 5.0):
        self.timeout = timeout

    def post(self, url: str, data: Any = None, headers: Optional[Dict[str, str]] = None, auth: Any = None,
             **_kw: Any) -> Response:
        return self.request("POST", url, data=data, headers=headers, auth=auth)

    def request(self, method: str, url: str, data: Any = None, headers: Optional[Dict[str, str]] = None,
                auth: Any = None, withhold_token: bool = False, **_kw: Any) -> Response:
        headers = dict(headers or {})
        if isinstance(data, dict):
            body = urllib.parse.urlencode(data)
        else:
            body = data or ""
        if auth is not None and hasattr(auth, "prepare"):
            url, headers, body = auth.prepare(method, url, headers, body)
        headers.setdefault("Accept", "application/json")
        if method.upper() == "POST":
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        raw = body.encode("utf-8") if isinstance(body, str) else body
        return request(method, url, data=raw if method.upper() != "GET" else None, headers=headers,
                       timeout=self.timeout)

    def close(self) -> None:  # authlib calls this on some paths
        pass
