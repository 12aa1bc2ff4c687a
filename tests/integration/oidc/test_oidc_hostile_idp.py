# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A hostile or compromised IdP (a tiny loopback HTTP stand-in) against the CLI and PAM (pamtester):
escape sequences and control characters in the device-grant text never reach the terminal, over-long values and
verification URIs off the issuer's origin are refused, a discovery document whose endpoints leave the issuer's
origin is refused before anything is sent there, and JSON nested thousands deep is a clean error."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from support.oidc_forge import claims_for, make_private_jwks, public_jwks, sign
from support.oidclab import AUD, PREFIX, pamtester, write_config

CLI = str(Path(sys.prefix) / "bin" / "gpufleet-oidc")
ALICE = f"{PREFIX}alice"
HOSTILE_CODE = "\x1b[2J\x1b[H\x1b]0;owned-title\x07WDJB-MJHT\x9b31m\r\nPassword: \u202e"
HOSTILE_MESSAGE = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\ \x1b[5mnow"


class StandIn:
    """Loopback HTTP server answering from ``routes`` ((method, path) -> (status, body bytes)); records requests."""

    def __init__(self):
        self.routes: dict = {}
        self.requests: list = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path, body))
                status, payload = outer.routes.get((self.command, self.path.split("?")[0]), (404, b"{}"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def json(self, method: str, path: str, obj, status: int = 200) -> None:
        self.routes[(method, path)] = (status, obj if isinstance(obj, bytes) else json.dumps(obj).encode())

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def idp():
    """A stand-in with a sane discovery document, JWKS and a token endpoint that answers access_denied."""
    s = StandIn()
    s.private = make_private_jwks(1)
    s.json("GET", "/.well-known/openid-configuration", {
        "issuer": s.issuer, "jwks_uri": s.issuer + "/jwks", "token_endpoint": s.issuer + "/token",
        "device_authorization_endpoint": s.issuer + "/device"})
    s.json("GET", "/jwks", public_jwks(s.private))
    s.json("POST", "/token", {"error": "access_denied"}, status=400)
    s.device = {"device_code": "dc-1", "user_code": "WDJB-MJHT", "verification_uri": s.issuer + "/activate",
                "interval": 1, "expires_in": 60}
    s.json("POST", "/device", s.device)
    yield s
    s.stop()


@pytest.fixture
def listener():
    """Where a hostile discovery document points: must never be contacted."""
    s = StandIn()
    yield s
    s.stop()


def _device(s: StandIn, **changes) -> None:
    s.json("POST", "/device", dict(s.device, **changes))


def _cli(tmp_path: Path, issuer: str, *args: str, stdin: str = "", **over) -> subprocess.CompletedProcess:
    cfg = write_config(tmp_path / "c.yml", issuer, tmp_path / "cache", device_timeout=5, **over)
    return subprocess.run([CLI, *args, "--config", str(cfg)], input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)


def _clean(text: str) -> bool:
    return not any(c in text for c in "\x1b\x9b\x07\r\u202e") and "owned-title" not in text


def test_cli_device_text_is_cleaned(idp, tmp_path):
    _device(idp, user_code=HOSTILE_CODE, message=HOSTILE_MESSAGE)
    r = _cli(tmp_path, idp.issuer, "device")
    assert r.returncode == 6 and "denied by the user" in r.stderr, r.stderr
    assert "confirm the code WDJB-MJHTPassword: " in r.stderr and _clean(r.stderr), ascii(r.stderr)
    _device(idp)  # control: a sane answer shows as is
    r = _cli(tmp_path, idp.issuer, "device")
    assert f"Open {idp.issuer}/activate and confirm the code WDJB-MJHT" in r.stderr, r.stderr
    _device(idp, verification_uri="https://microsoft.com/devicelogin")  # another host than the issuer, like Entra
    r = _cli(tmp_path, idp.issuer, "device")
    assert r.returncode == 6 and "Open https://microsoft.com/devicelogin and confirm" in r.stderr, r.stderr


def test_pam_device_prompt_is_cleaned(idp, pam_env, tmp_path):
    _device(idp, user_code=HOSTILE_CODE, message=HOSTILE_MESSAGE,
            verification_uri_complete=idp.issuer + "/activate?user_code=WDJB-MJHT")
    service = pam_env.service(write_config(tmp_path / "p.yml", idp.issuer, tmp_path / "cache", device_timeout=5),
                              "device")
    seen = []
    rc, out = pamtester(service, ALICE, lambda p: seen.append(p) or "")
    assert seen and f"open {idp.issuer}/activate?user_code=WDJB-MJHT" in seen[0], out
    assert "confirm the code WDJB-MJHTPassword: ." in seen[0] and _clean(out), ascii(out)
    assert rc != 0 and "denied by the user" in pam_env.log_text()


@pytest.mark.parametrize("changes, reason", [
    ({"verification_uri": "{iss}/activate\x1b[8m"}, "verification_uri is not a plain https URL"),
    ({"verification_uri": "{iss}/activate\r\nPassword:"}, "verification_uri is not a plain https URL"),
    ({"verification_uri": "javascript:alert(1)//https://x"}, "verification_uri is not a plain https URL"),
    ({"verification_uri": "http://evil.example/activate"}, "verification_uri is not a plain https URL"),
    ({"verification_uri": "{iss}/" + "a" * 5000}, "verification_uri is not a plain https URL"),
    ({"verification_uri_complete": "file:///etc/shadow"}, "verification_uri_complete is not a plain https URL"),
    ({"verification_uri_complete": "{iss}/?code=\u202eWDJB"}, "verification_uri_complete is not a plain https URL"),
    ({"user_code": "W" * 5000}, "user_code is empty or longer than 64"),
    ({"user_code": "\x1b[2J\x07"}, "user_code is empty"),
    ({"error": "\x1b[2Jbad", "error_description": "x\x1b]0;t\x07y" * 100}, "device authorization refused: bad: xy"),
])
def test_hostile_device_answers_refused_before_any_prompt(idp, pam_env, tmp_path, changes, reason):
    _device(idp, **{k: v.replace("{iss}", idp.issuer) for k, v in changes.items()})
    r = _cli(tmp_path, idp.issuer, "device")
    assert r.returncode == 6 and reason in r.stderr and _clean(r.stderr), ascii(r.stderr)
    assert "Open " not in r.stderr
    service = pam_env.service(write_config(tmp_path / "p.yml", idp.issuer, tmp_path / "cache"), "device")
    rc, out = pamtester(service, ALICE, lambda p: pytest.fail(f"prompted: {p!r}"))
    assert rc != 0 and "open " not in out and _clean(out), ascii(out)
    assert reason in pam_env.log_text() and _clean(pam_env.log_text())
    assert not any(p == "/token" for _m, p, _b in idp.requests)  # no polling on a refused grant


@pytest.mark.parametrize("key", ["token_endpoint", "device_authorization_endpoint", "jwks_uri"])
def test_discovery_endpoint_off_origin_refused(idp, listener, tmp_path, key):
    doc = json.loads(idp.routes[("GET", "/.well-known/openid-configuration")][1])
    doc[key] = listener.issuer + "/steal"  # loopback, other port: any local user could listen there
    idp.json("GET", "/.well-known/openid-configuration", doc)
    r = _cli(tmp_path, idp.issuer, "device")
    assert r.returncode == 5 and f"discovery {key}" in r.stderr and "leaves the issuer's origin" in r.stderr, r.stderr
    token = sign(idp.private, claims_for(idp.issuer, AUD, user=ALICE))
    r = _cli(tmp_path, idp.issuer, "validate", stdin=token)
    assert r.returncode == 5 and "leaves the issuer's origin" in r.stderr, r.stderr
    assert listener.requests == []  # no client secret, device code or key fetch went there


def test_discovery_control_accepts_genuine_token(idp, tmp_path):
    token = sign(idp.private, claims_for(idp.issuer, AUD, user=ALICE))
    r = _cli(tmp_path, idp.issuer, "validate", stdin=token)
    assert (r.returncode, r.stdout.strip()) == (0, ALICE), r.stderr


@pytest.mark.parametrize("path", ["/.well-known/openid-configuration", "/jwks"])
def test_deeply_nested_idp_json_is_clean_error(idp, tmp_path, path):
    idp.json("GET", path, b"[" * 200_000 + b"]" * 200_000)
    r = _cli(tmp_path, idp.issuer, "validate", stdin=sign(idp.private, claims_for(idp.issuer, AUD, user=ALICE)))
    assert r.returncode == 5 and "is not JSON" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr


@pytest.mark.parametrize("over, key", [
    ({"client_secret": 918273645}, "client_secret"),
    ({"proxy": "http://svc:hunter2-Zq9@proxy.example:3128/x"}, "proxy"),
])
def test_pam_log_never_shows_config_secrets(idp, pam_env, tmp_path, over, key):
    service = pam_env.service(write_config(tmp_path / "p.yml", idp.issuer, tmp_path / "cache", **over), "token")
    rc, out = pamtester(service, ALICE, lambda p: "x")
    log = pam_env.log_text()
    assert rc != 0 and f"config key '{key}'" in log, log
    assert "918273645" not in log + out and "hunter2" not in log + out, log


@pytest.mark.parametrize("mode", ["device", "token"])
def test_pam_refuses_hostile_login_name_before_the_idp(idp, pam_env, tmp_path, mode):
    """The login name comes from the SSH client: escape sequences there never reach a prompt, the log or the IdP."""
    service = pam_env.service(write_config(tmp_path / "p.yml", idp.issuer, tmp_path / "cache"), mode)
    for name in (f"{PREFIX}\x1b]0;owned-title\x07alice", f"{PREFIX}\u212aate", f"{PREFIX}alice\r\nPassword:"):
        rc, out = pamtester(service, name, lambda p: pytest.fail(f"prompted: {p!r}"))
        assert rc != 0, out
    log = pam_env.log_text()
    assert log.count("not plain ASCII") == 3 and not any(c in log for c in "\x1b\x07\r\u212a"), ascii(log)
    assert "'gfo\\x1b]0;owned-title\\x07alice'" in log  # escaped, so the operator still sees what was tried
    assert [r for r in idp.requests if r[1] != "/.well-known/openid-configuration"] == []
