# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real parts for the OIDC integration tests, all on 127.0.0.1 (helpers; tests/integration/oidc/conftest.py exposes
the fixtures).

* ``idp_factory`` starts npm oidc-provider (tests/idp/server.mjs) on a free port with a private
  JWKS owned by the test, reads its READY line and stops it by PID.
* ``approve`` plays the human on oidc-provider's devInteractions pages over plain HTTP:
  GET verification_uri_complete -> auto-submit form (xsrf, user_code) -> POST /device -> confirm
  form -> POST /device confirm=yes (or abort=yes) -> /interaction/<uid> login form ->
  POST prompt=login -> /interaction/<uid2> consent form -> POST prompt=consent -> "Sign-in Success".
* ``pam_env`` lays out the pam_python entry file, the link to the collection's code and test
  users; PAM service files are written as /etc/pam.d/gfotest-<random> (pamtester and sshd only
  read services from there) and removed at teardown.
"""
from __future__ import annotations

import http.cookiejar
import json
import os
import re
import secrets
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from support.oidc_forge import make_private_jwks, public_jwks
from support.shared import shared

REPO = Path(__file__).resolve().parents[2]

IDP_DIR = REPO / "tests" / "idp"
MODULE_UTILS = REPO / "plugins" / "module_utils"
PAM_ENTRY = REPO / "roles" / "oidc_login" / "files" / "pam_gpufleet_oidc.py"
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
AUD = "urn:gpufleet:ssh"
PREFIX = "gfo"
PLAYBOOK = Path(sys.prefix) / "bin" / "ansible-playbook"

# Local test users (created for the run, deleted afterwards) and their IdP accounts.
USERS = {
    f"{PREFIX}alice": ["hpc-users", "gpu-a100"],
    f"{PREFIX}bob": ["students"],
    f"{PREFIX}dave": ["hpc-users"] + [f"proj-{i:03d}-gpu-allocation-group" for i in range(40)],
    f"{PREFIX}kate": ["hpc-users"],
}
ACCOUNTS = {u: {"preferred_username": u, "name": u.title(), "email": f"{u}@example.test", "email_verified": True,
                "groups": g} for u, g in USERS.items()}
ACCOUNTS[f"{PREFIX}carol"] = {"preferred_username": f"{PREFIX}carol", "groups": ["hpc-users"]}  # no local user
# Other identities whose preferred_username looks like (or folds onto) the local user gfokate: account id -> name.
LOOK_ALIKES = {
    "lookalike-kelvin": f"{PREFIX}\u212aate",  # KELVIN SIGN: str.lower() gives "gfokate"
    "lookalike-kelvin-upper": f"{PREFIX.upper()}\u212aATE",
    "lookalike-fullwidth": "".join(chr(0xFF00 + ord(c) - 0x20) for c in f"{PREFIX}kate"),  # NFKC -> gfokate
    "lookalike-long-s": f"{PREFIX}kate\u017f",  # long s: casefold -> "s"
    "lookalike-cyrillic": f"{PREFIX}k\u0430te",  # CYRILLIC SMALL LETTER A
}
for _acct, _name in LOOK_ALIKES.items():
    ACCOUNTS[_acct] = {"preferred_username": _name, "groups": ["hpc-users"]}
ACCOUNTS["kate-upper"] = {"preferred_username": f"{PREFIX.upper()}KATE", "groups": ["hpc-users"]}  # ASCII: folds


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM a process this test started; SIGKILL it when it has not ended within 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def remove_user(name: str) -> None:
    """userdel -r a local user made by a test; sshd's per-connection children of a test login may still be
    exiting: poll, then force."""
    deadline = time.monotonic() + 15
    while _run("userdel", "-r", name).returncode not in (0, 6, 12) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _run("getent", "passwd", name).returncode == 0:
        _run("userdel", "-r", "-f", name)


class IdP:
    def __init__(self, workdir: Path, jwks: dict, env: dict | None = None):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.jwks_path = workdir / "jwks.private.json"
        self.jwks_path.write_text(json.dumps(jwks))
        (workdir / "accounts.json").write_text(json.dumps(ACCOUNTS))
        self.env = dict(os.environ, IDP_PORT="0", IDP_JWKS=str(self.jwks_path),
                        IDP_ACCOUNTS=str(workdir / "accounts.json"))
        self.env.update(env or {})
        self.proc = None
        self.lines: list[str] = []
        self.issuer = None

    def start(self, timeout: float = 20.0) -> IdP:
        if not (IDP_DIR / "node_modules" / "oidc-provider").is_dir():
            raise RuntimeError("tests/idp/node_modules missing: run `make setup` (npm ci)")
        self.lines = []
        with open(self.workdir / "idp.err", "ab") as err:
            self.proc = subprocess.Popen(["node", str(IDP_DIR / "server.mjs")], cwd=str(IDP_DIR), env=self.env,
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        ready = threading.Event()

        def reader():
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("READY "):
                    self.issuer = json.loads(line[6:])["issuer"]
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        if not ready.wait(timeout) or self.issuer is None:
            self.stop()
            raise RuntimeError(f"IdP did not start: {(self.workdir / 'idp.err').read_text()[-2000:]}")
        return self

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)

    def hits(self, path: str) -> int:
        return sum(1 for line in self.lines if line == f"REQ GET {path}")

    def public_jwks(self) -> dict:
        return public_jwks(json.loads(self.jwks_path.read_text()))


@pytest.fixture
def idp_factory(tmp_path):
    started: list[IdP] = []

    def make(jwks: dict | None = None, name: str = "idp", **env) -> IdP:
        i = IdP(tmp_path / name, jwks or make_private_jwks(1), {k: str(v) for k, v in env.items()})
        started.append(i)
        return i.start()

    yield make
    for i in started:
        i.stop()


@pytest.fixture(scope="module")
def module_idp(tmp_path_factory):
    i = IdP(tmp_path_factory.mktemp("idp"), make_private_jwks(1)).start()
    yield i
    i.stop()


# ---------------------------------------------------------------- scripted approval
class _Browser:
    def __init__(self):
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar),
                                                  urllib.request.ProxyHandler({}))

    def go(self, url: str, data: dict | None = None) -> tuple[str, str]:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        with self.opener.open(urllib.request.Request(url, data=body), timeout=10) as r:
            return r.geturl(), r.read().decode()


def _form(html: str, base: str) -> tuple[str, dict]:
    m = re.search(r'<form[^>]*action="([^"]+)"', html)
    if not m:
        raise AssertionError(f"no form in IdP page: {html[:500]}")
    action = urllib.parse.urljoin(base, m.group(1).replace("&amp;", "&"))
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html))
    return action, fields


def approve(verification_uri_complete: str, account: str, deny: bool = False) -> str:
    """Approve (or deny) a device code as ``account``; returns the final page title."""
    b = _Browser()
    url, page = b.go(verification_uri_complete)  # auto-submit form {xsrf, user_code}
    action, fields = _form(page, url)
    url, page = b.go(action, fields)  # confirm page
    action, fields = _form(page, url)
    if deny:
        fields.pop("confirm", None)
        fields["abort"] = "yes"
        url, page = b.go(action, fields)
        return "aborted"
    url, page = b.go(action, fields)  # -> /interaction/<uid> login
    action, _fields = _form(page, url)
    url, page = b.go(action, {"prompt": "login", "login": account, "password": "any"})
    if 'name="prompt" value="consent"' in page:
        action, _fields = _form(page, url)
        url, page = b.go(action, {"prompt": "consent"})
    title = re.search(r"<title>([^<]*)</title>", page)
    return title.group(1) if title else page[:200]


def approve_later(uri: str, account: str, deny: bool = False) -> threading.Thread:
    t = threading.Thread(target=approve, args=(uri, account, deny), daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------- config helpers
def write_config(path: Path, issuer: str, cache_dir: Path, **over) -> Path:
    conf = {
        "issuer": issuer, "audience": AUD, "username_claim": "preferred_username", "groups_claim": "groups",
        "allowed_groups": ["hpc-users"], "jwks_cache_dir": str(cache_dir), "client_id": "gpufleet-device",
        "client_secret": "device-secret", "scope": "openid profile email groups ssh", "device_timeout": 30,
        "http_timeout": 3, "min_refresh_interval": 30,
    }
    conf.update(over)
    path.write_text(yaml.safe_dump(conf))
    os.chmod(path, 0o600)
    return path


def real_token(issuer: str, account: str, tmp: Path, kind: str = "access_token", **over) -> str:
    """A real token (access or ID token) via the device grant and scripted approval."""
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import load_config
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.core import Authenticator

    cfg = load_config(str(write_config(tmp / f"tok-{secrets.token_hex(3)}.yml", issuer, tmp / "tokcache", **over)))
    auth = Authenticator(cfg)
    dg = auth.device_grant()
    grant = dg.start()
    assert approve(grant["verification_uri_complete"], account) == "Sign-in Success"
    return dg.poll(grant, 20)[kind]


# ---------------------------------------------------------------- PAM / users
def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="session")
def local_users():
    """The test users, shared with every other test process that uses them now (another lane, another xdist
    worker): made by the first holder if missing, removed by the last one if a holder made them."""

    def exist() -> bool:
        return all(_run("getent", "passwd", u).returncode == 0 for u in USERS)

    def make() -> None:
        for u in USERS:
            if _run("getent", "passwd", u).returncode != 0:
                r = _run("useradd", "-m", "-s", "/bin/bash", u)
                assert r.returncode == 0, r.stderr

    def remove() -> None:
        for u in USERS:
            remove_user(u)

    with shared("test-users", exist, make, remove):
        yield list(USERS)


class PamEnv:
    def __init__(self, root: Path):
        self.root = root
        self.lib = root / "lib"
        self.lib.mkdir(parents=True)
        # the oidc_login role's layout: lib/ansible_collections/gpufleet/reliability/plugins/module_utils
        pkg = self.lib.joinpath("ansible_collections", "gpufleet", "reliability", "plugins", "module_utils")
        pkg.parent.mkdir(parents=True)
        pkg.symlink_to(MODULE_UTILS)
        self.entry = root / "pam_gpufleet_oidc.py"
        shutil.copy(PAM_ENTRY, self.entry)
        self.log = root / "pam.log"
        self.services: list[Path] = []

    def service(self, config: Path, mode: str, account_stack: str = "pam_permit.so") -> str:
        name = f"gfotest-{secrets.token_hex(4)}"
        p = Path("/etc/pam.d") / name
        p.write_text(
            "# TEST-ONLY service written by tests/integration/oidc (removed at teardown)\n"
            f"auth required /lib/security/pam_python.so {self.entry} config={config} lib={self.lib} "
            f"site={SITE} debug_log={self.log} mode={mode}\n"
            f"account required {account_stack}\n"
            f"session required {account_stack}\n")
        self.services.append(p)
        return name

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def cleanup(self) -> None:
        for p in self.services:
            p.unlink(missing_ok=True)


@pytest.fixture
def pam_env(tmp_path, local_users):
    env = PamEnv(tmp_path / "pam")
    yield env
    env.cleanup()


def pamtester(service: str, user: str, answer_fn, timeout: float = 60) -> tuple[int, str]:
    """Run pamtester; ``answer_fn(prompt_text)`` returns the line to type at the (single) prompt."""
    proc = subprocess.Popen(["pamtester", "-v", service, user, "authenticate"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return converse(proc, answer_fn, timeout)


def converse(proc: subprocess.Popen, answer_fn, timeout: float, is_prompt=None) -> tuple[int, str]:
    """Read the process output; when a prompt appears, answer it once. Returns (rc, output)."""
    is_prompt = is_prompt or (lambda b: b.rstrip().endswith(":") and ("token" in b or "Press Enter" in b))
    fd = proc.stdout.fileno()
    out = b""
    pending = ""
    answered = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _wready, _xready = select.select([fd], [], [], 0.2)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                out += chunk
                pending += chunk.decode("utf-8", "replace")
                if not answered and is_prompt(pending):
                    line = answer_fn(pending)
                    proc.stdin.write((line + "\n").encode())
                    proc.stdin.flush()
                    answered = True
                    pending = ""
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    return proc.returncode, out.decode("utf-8", "replace")


# ---------------------------------------------------------------- sshd
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, log: Path | None = None, timeout: float = 15) -> None:
    """Wait until something listens on 127.0.0.1:``port``; fails if ``proc`` (an sshd) exits first, showing its
    ``log`` when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None:
                raise AssertionError("sshd exited" + (f": {log.read_text()}" if log else "")) from None
            time.sleep(0.05)
    raise AssertionError("sshd did not listen")


class Sshd:
    """A real sshd on 127.0.0.1 under a symlinked name, so its PAM service is that name."""

    def __init__(self, root: Path, pam_service: str, users: list[str]):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.key = root / "host_ed25519"
        r = _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        assert r.returncode == 0, r.stderr
        self.binary = root / pam_service  # sshd 9.2 has no PAMServiceName: argv[0] is the service
        self.binary.symlink_to("/usr/sbin/sshd")
        self.config = root / "sshd_config"
        self.config.write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {self.key}\nPidFile {root / 'sshd.pid'}\n"
            "UsePAM yes\nKbdInteractiveAuthentication yes\nPasswordAuthentication no\nPubkeyAuthentication no\n"
            "PermitRootLogin no\nAuthenticationMethods keyboard-interactive\n"
            f"AllowUsers {' '.join(users)}\nMaxAuthTries 2\nLoginGraceTime 60\nStrictModes no\n")
        self.log = root / "sshd.log"
        self.proc = None

    def start(self) -> Sshd:
        r = _run(str(self.binary), "-t", "-f", str(self.config))
        assert r.returncode == 0, r.stderr
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(self.binary), "-D", "-e", "-f", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc, self.log)
        return self

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)


@pytest.fixture
def sshd_factory(tmp_path, run_sshd_dir):
    started: list[Sshd] = []

    def make(pam_service: str) -> Sshd:
        s = Sshd(tmp_path / f"sshd-{len(started)}", pam_service, list(USERS)).start()
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def ssh_login(port: int, user: str, answer_fn, timeout: float = 60) -> tuple[int, str]:
    """OpenSSH client in a pty (keyboard-interactive); runs `id -un` on success."""
    import pexpect

    child = pexpect.spawn("ssh", ["-p", str(port), "-o", "StrictHostKeyChecking=no", "-o",
                                  "UserKnownHostsFile=/dev/null", "-o", "PreferredAuthentications=keyboard-interactive",
                                  "-o", "NumberOfPasswordPrompts=1", "-o", "LogLevel=ERROR", "-F", "/dev/null",
                                  f"{user}@127.0.0.1", "id -un"], timeout=timeout, encoding="utf-8")
    out = ""
    try:
        idx = child.expect([r"Press Enter here after you have approved: ", r"OIDC access token: ",
                            pexpect.EOF, pexpect.TIMEOUT])
        out += child.before + (child.after if isinstance(child.after, str) else "")
        if idx in (0, 1):
            child.sendline(answer_fn(out))
            child.expect([pexpect.EOF, pexpect.TIMEOUT])
            out += child.before
    finally:
        child.close(force=True)
    return child.exitstatus if child.exitstatus is not None else 255, out
