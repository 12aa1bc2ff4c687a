# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The JWKS cache against an unprivileged attacker racing the reader.

A forked child drops to ``nobody`` and swaps names in a tight loop with renameat2(RENAME_EXCHANGE) while this
(root) process validates tokens signed with the attacker's key, each with a fresh JWKSCache (so every validation
reads the disk). Two layouts:

* ``dir-mode-0777`` / ``dir-owned-by-nobody``: a site left the cache directory writable by the attacker, who
  swaps the genuine cache file with a symlink to their own JWKS (the check-then-open race of a by-name reader);
* ``parent-writable``: the cache directory itself is private, but its parent is writable by the attacker, who
  swaps the whole directory with one of their own holding a symlink to their JWKS.

Zero acceptances of the attacker's tokens, however the swaps fall. Every layout is refused outright (fail
closed): a cache directory the attacker can write, and since issue 26 a parent writable by everyone without the
sticky bit, in which genuine tokens used to be accepted whenever the genuine directory was in place. Loops are
bounded in count and time.
"""
from __future__ import annotations

import ctypes
import json
import os
import pwd
import select
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import parse_config
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import OIDCError
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import JWKSCache
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import TokenValidator
from support.oidc_forge import AUD, ISSUER, claims_for, make_private_jwks, public_jwks, sign

AT_FDCWD = -100
RENAME_EXCHANGE = 2
ATTEMPTS = 1500  # attacker tokens per layout (and as many genuine controls where the layout allows them)
READER_SECONDS = 45  # upper bound on the reader loop
SWAPPER_SECONDS = 90  # the attacker stops by itself after this, whatever happens to the test


def _swapper(a: str, b: str, stop: str, report_fd: int) -> None:
    """Child: become nobody, exchange ``a`` and ``b`` until ``stop`` exists; report the number of swaps."""
    count = failures = 0
    err = 0
    try:
        nobody = pwd.getpwnam("nobody")
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
        libc = ctypes.CDLL(None, use_errno=True)
        ba, bb = a.encode(), b.encode()
        deadline = time.monotonic() + SWAPPER_SECONDS
        while time.monotonic() < deadline:
            for _i in range(500):
                if libc.renameat2(AT_FDCWD, ba, AT_FDCWD, bb, RENAME_EXCHANGE) == 0:
                    count += 1
                else:
                    failures += 1
                    err = ctypes.get_errno()
            if os.path.exists(stop):
                break
        os.write(report_fd, json.dumps({"swaps": count, "failures": failures, "errno": err,
                                        "uid": os.getuid()}).encode())
    finally:
        os._exit(0)


class Attacker:
    def __init__(self, a: Path, b: Path, stop: Path):
        self.stop_file = stop
        r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - child
            os.close(r)
            _swapper(str(a), str(b), str(stop), w)
        os.close(w)
        self.read_fd = r

    def stop(self) -> dict:
        self.stop_file.touch()
        data = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _w, _x = select.select([self.read_fd], [], [], 0.5)
            if ready:
                chunk = os.read(self.read_fd, 4096)
                if not chunk:
                    break
                data += chunk
        os.close(self.read_fd)
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        return json.loads(data or b"{}")


@pytest.fixture
def arena():
    """A directory under /tmp that nobody can traverse (tmp_path is root-only), removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="gfo-race-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _cfg(cache_dir: Path):
    return parse_config({"issuer": ISSUER, "audience": AUD, "username_claim": "preferred_username",
                         "groups_claim": "groups", "allowed_groups": ["hpc-users"], "jwks_cache_dir": str(cache_dir),
                         "http_timeout": 1, "min_refresh_interval": 3600})


def _accepted(cfg, token: str) -> bool:
    try:
        TokenValidator(cfg, JWKSCache.from_config(cfg)).validate(token)
        return True
    except OIDCError:
        return False


def _attacker_files(arena: Path, cache: JWKSCache, attacker_private: dict) -> Path:
    """The attacker's own cache document (fresh, right issuer, their key under the genuine kid), owned by nobody."""
    nobody = pwd.getpwnam("nobody")
    now = time.time() + 3600  # stays "fresh" for the whole run
    doc = {"issuer": ISSUER, "metadata": None, "metadata_fetched_at": 0, "keys": public_jwks(attacker_private)["keys"],
           "jwks_fetched_at": now, "refresh_attempt_at": now}
    p = arena / "attacker.json"
    p.write_text(json.dumps(doc))
    os.chmod(p, 0o600)
    os.chown(p, nobody.pw_uid, nobody.pw_gid)
    return p


@pytest.mark.parametrize("layout", ["dir-mode-0777", "dir-owned-by-nobody", "parent-writable"])
def test_swapping_attacker_never_gets_a_token_accepted(arena, layout):
    genuine, attacker_private = make_private_jwks(1), make_private_jwks(1)  # same kid "rs-1", different keys
    nobody = pwd.getpwnam("nobody")
    parent = arena / "parent"
    parent.mkdir()
    cache_dir = parent / "cache"
    cfg = _cfg(cache_dir)
    cache = JWKSCache.from_config(cfg)
    cache.seed(public_jwks(genuine))
    good = sign(genuine, claims_for(ISSUER, AUD, user="alice"))
    bad = sign(attacker_private, claims_for(ISSUER, AUD, user="alice"))
    assert _accepted(cfg, good) and not _accepted(cfg, bad)  # controls before the attacker gets a foothold
    evil_json = _attacker_files(arena, cache, attacker_private)

    if layout == "parent-writable":
        os.chmod(parent, 0o777)
        evil_dir = parent / "evil"
        evil_dir.mkdir(mode=0o700)
        (evil_dir / os.path.basename(cache.path)).symlink_to(evil_json)
        os.lchown(evil_dir / os.path.basename(cache.path), nobody.pw_uid, nobody.pw_gid)
        os.chown(evil_dir, nobody.pw_uid, nobody.pw_gid)
        swap_a, swap_b = cache_dir, evil_dir
    else:
        if layout == "dir-mode-0777":
            os.chmod(cache_dir, 0o777)
        else:
            os.chown(cache_dir, nobody.pw_uid, nobody.pw_gid)
        link = cache_dir / ".attacker-link"
        link.symlink_to(evil_json)
        os.lchown(link, nobody.pw_uid, nobody.pw_gid)
        swap_a, swap_b = Path(cache.path), link

    attacker = Attacker(swap_a, swap_b, arena / "stop")
    accepted_bad = accepted_good = tried = 0
    deadline = time.monotonic() + READER_SECONDS
    try:
        while tried < ATTEMPTS and time.monotonic() < deadline:
            tried += 1
            accepted_bad += _accepted(cfg, bad)
            accepted_good += _accepted(cfg, good)
    finally:
        report = attacker.stop()
    assert report.get("uid") == nobody.pw_uid, report  # the swaps really ran unprivileged
    assert report.get("swaps", 0) > 100, report  # and really raced the reader
    assert tried >= 50, tried
    assert accepted_bad == 0, f"{accepted_bad} of {tried} attacker tokens accepted ({layout}, {report})"
    # an attacker-writable cache directory, or one in a parent everyone may write without the sticky bit, is
    # refused outright: fail closed
    assert accepted_good == 0, f"{accepted_good} genuine tokens accepted ({layout})"
