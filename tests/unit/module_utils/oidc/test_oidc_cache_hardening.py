"""The JWKS cache and the log file against files planted by someone else: directory checked on every read,
descriptors checked with fstat, no symlink followed (cache, lock, log), no FIFO written to or waited on; JSON nested
thousands deep is a clean refusal, never a RecursionError."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import core, transport
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import (
    ConfigError,
    IdPUnavailable,
    TokenRejected,
)
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import JWKSCache
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import TokenValidator
from support.oidc_forge import AUD, ISSUER, b64u, claims_for, make_private_jwks, public_jwks, sign


def _fresh_attacker_cache(cache, attacker_pub):
    return {"issuer": ISSUER, "metadata": None, "metadata_fetched_at": 0, "keys": attacker_pub["keys"],
            "jwks_fetched_at": time.time(), "refresh_attempt_at": time.time()}


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_loose_cache_dir_refused_on_read(seeded, private_jwks, mode):
    cfg, cache = seeded()
    good = sign(private_jwks, claims_for(ISSUER, AUD))
    assert TokenValidator(cfg, JWKSCache.from_config(cfg)).validate(good)["sub"] == "sub-alice"  # control
    os.chmod(cfg.jwks_cache_dir, mode)  # the keys inside are fresh: reading them was enough before
    with pytest.raises(ConfigError, match="writable by group or others") as ei:
        TokenValidator(cfg, JWKSCache.from_config(cfg)).validate(good)
    assert ei.value.key == "jwks_cache_dir"


def test_cache_dir_that_is_a_file_refused(make_cfg, tmp_path):
    (tmp_path / "cache").write_text("{}")
    with pytest.raises(ConfigError, match="not a directory"):
        JWKSCache.from_config(make_cfg()).get_state()


def test_a_link_planted_as_the_cache_dir_is_not_followed(seeded, private_jwks, tmp_path):
    """Issue 26: a symbolic link in the cache directory's place, pointing at a directory of ours (as /etc is
    root's), passed the owner check; the directory is opened with O_NOFOLLOW now."""
    cfg, cache = seeded()
    good = sign(private_jwks, claims_for(ISSUER, AUD))
    assert TokenValidator(cfg, JWKSCache.from_config(cfg)).validate(good)  # the control
    ours = tmp_path / "ours"
    os.rename(cfg.jwks_cache_dir, ours)
    os.symlink(ours, cfg.jwks_cache_dir)
    with pytest.raises(ConfigError, match="is a symbolic link; give the directory itself") as ei:
        TokenValidator(cfg, JWKSCache.from_config(cfg)).validate(good)
    assert ei.value.key == "jwks_cache_dir"


def test_a_cache_dir_in_a_world_writable_parent_without_sticky_bit_is_refused(make_cfg, tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)
    with pytest.raises(ConfigError, match="writable by everyone .* without the sticky bit"):
        JWKSCache.from_config(make_cfg(jwks_cache_dir=str(parent / "cache"))).seed({"keys": []})
    os.chmod(parent, 0o1777)  # /tmp-like: the control
    JWKSCache.from_config(make_cfg(jwks_cache_dir=str(parent / "cache"))).seed({"keys": []})


def test_missing_parents_are_made_0755_under_umask_000(make_cfg, tmp_path):
    target = tmp_path / "a" / "b" / "cache"
    old = os.umask(0)
    try:
        JWKSCache.from_config(make_cfg(jwks_cache_dir=str(target))).seed({"keys": []})
    finally:
        os.umask(old)
    modes = [os.stat(p).st_mode & 0o777 for p in (tmp_path / "a", tmp_path / "a" / "b", target)]
    assert modes == [0o755, 0o755, 0o700], [oct(m) for m in modes]


def test_symlinked_cache_file_not_followed(seeded, tmp_path):
    cfg, cache = seeded()
    attacker = make_private_jwks(9)
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps(_fresh_attacker_cache(cache, public_jwks(attacker))))
    os.chmod(evil, 0o600)
    os.unlink(cache.path)
    os.symlink(evil, cache.path)
    lines = []
    with pytest.raises(IdPUnavailable):  # ignored, IdP (127.0.0.1:9) down: fail closed
        TokenValidator(cfg, JWKSCache.from_config(cfg, log=lines.append)).validate(
            sign(attacker, claims_for(ISSUER, AUD), kid="rs-9"))
    assert any("symbolic links" in line for line in lines), lines


def test_hard_linked_cache_file_ignored(seeded, tmp_path):
    cfg, cache = seeded()
    os.link(cache.path, tmp_path / "second-name")
    lines = []
    assert JWKSCache.from_config(cfg, log=lines.append)._load() is None
    assert any("2 hard links" in line for line in lines), lines


def test_lock_file_symlink_not_followed(seeded, tmp_path):
    cfg, cache = seeded()
    target = tmp_path / "created-by-root"
    os.unlink(cache.path + ".lock")  # left by seeding; an attacker who could write the directory plants a link
    os.symlink(target, cache.path + ".lock")
    with pytest.raises(ConfigError, match="lock file"):
        JWKSCache.from_config(cfg).seed(public_jwks(make_private_jwks(1)))
    assert not target.exists()


def test_fifo_at_cache_path_does_not_hang(seeded):
    cfg, cache = seeded()
    os.unlink(cache.path)
    os.mkfifo(cache.path, 0o600)
    lines = []
    assert JWKSCache.from_config(cfg, log=lines.append)._load() is None  # returns: O_NONBLOCK, then fstat
    assert any("not a regular file" in line for line in lines), lines


def test_log_file_refuses_fifo_with_reader(tmp_path):
    fifo = tmp_path / "oidc.log"
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # someone listening at the planted FIFO
    try:
        core.file_logger(str(fifo))("accepted user=alice sub='secret-sub'")
        assert os.read(reader, 4096) == b""  # nothing was written to it (no writer left: end of file)
    finally:
        os.close(reader)


def test_log_file_fifo_without_reader_does_not_hang(tmp_path):
    fifo = tmp_path / "oidc.log"
    os.mkfifo(fifo, 0o600)
    code = ("from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import core; "
            f"core.file_logger({str(fifo)!r})('x'); print('returned')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.stdout.strip() == "returned", r.stderr


def test_log_file_hard_link_not_written(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    os.chmod(victim, 0o600)
    os.link(victim, tmp_path / "oidc.log")
    core.file_logger(str(tmp_path / "oidc.log"))("planted")
    assert victim.read_text() == "keep\n"


# ------------------------------------------------------------------------------------------------ nested JSON
DEEP = 100_000


def test_deeply_nested_header_is_malformed_token(seeded, private_jwks):
    cfg, cache = seeded()
    payload = b64u(json.dumps(claims_for(ISSUER, AUD)).encode())
    for nest in ("[" * DEEP + "]" * DEEP, '{"a":' * DEEP + "1" + "}" * DEEP):
        tok = f"{b64u(nest.encode())}.{payload}.c2ln"
        cfg.max_token_bytes = len(tok) + 1
        with pytest.raises(TokenRejected) as ei:
            TokenValidator(cfg, cache).validate(tok)
        assert ei.value.reason.startswith("malformed token") and "RecursionError" not in ei.value.reason


def test_deeply_nested_signed_payload_is_malformed_token(seeded, private_jwks):
    """Only the IdP's key can sign it, but a compromised or buggy IdP must still get a clean refusal."""
    cfg, cache = seeded()
    from joserfc.jwk import RSAKey
    from joserfc.jws import serialize_compact

    key = RSAKey.import_key(next(k for k in private_jwks["keys"] if k["kid"] == "rs-1"))
    body = ("[" * 5000 + "]" * 5000).encode()
    tok = serialize_compact({"alg": "RS256", "kid": "rs-1"}, body, key)
    cfg.max_token_bytes = len(tok) + 1
    with pytest.raises(TokenRejected) as ei:
        TokenValidator(cfg, cache).validate(tok)
    assert ei.value.reason.startswith("malformed token"), ei.value.reason


def test_deeply_nested_cache_file_ignored(seeded):
    cfg, cache = seeded()
    with open(cache.path, "w") as fh:
        fh.write("[" * DEEP + "]" * DEEP)
    assert JWKSCache.from_config(cfg)._load() is None


def test_json_loads_never_raises_recursion_error():
    for raw in ("[" * DEEP, "[" * DEEP + "]" * DEEP, b"\xff\xfe", b'{"a": "\xc3"}'):
        with pytest.raises(ValueError):
            transport.json_loads(raw)
    assert transport.json_loads(b'{"a": [1]}') == {"a": [1]}


def test_oversized_cache_file_ignored(seeded):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import MAX_CACHE_BYTES

    cfg, cache = seeded()
    with open(cache.path) as fh:
        good = fh.read()
    assert JWKSCache.from_config(cfg)._load() is not None  # control
    with open(cache.path, "w") as fh:
        fh.write(good + " " * (MAX_CACHE_BYTES + 1 - len(good)))  # valid JSON, one byte too long
    lines = []
    assert JWKSCache.from_config(cfg, log=lines.append)._load() is None
    assert lines, lines
