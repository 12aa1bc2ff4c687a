# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery and a JWKS cache on disk shared by every login process.

One JSON file per issuer under ``jwks_cache_dir`` (directory 0700, file 0600, owned by the
running user, written atomically). Every access goes through a descriptor of the directory that was
checked (``fstat``: a directory of ours, not group/other-writable), and files are opened relative to
it with ``O_NOFOLLOW`` and checked with ``fstat`` on the open descriptor (a private regular file of
ours with one link): nothing is looked up twice by name, so swapping a file, a symlink or the whole
directory between a check and the open has nothing to win. It holds the discovery document, the public keys and
three time stamps:

* ``metadata_fetched_at`` / ``jwks_fetched_at``: fresh for ``metadata_ttl`` / ``jwks_ttl``;
  past that a refresh is tried, and when the IdP is unreachable the stale copy is still used
  for up to ``max_stale`` seconds (logins survive IdP outages);
* ``refresh_attempt_at``: an unknown ``kid`` triggers a refresh only when the last attempt is
  older than ``min_refresh_interval``. The stamp is written *before* fetching and lives in the
  shared file, so a flood of forged kids costs the IdP at most one request per interval across
  all processes.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import stat
import time
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, overload

from ..fileutil import atomic_write
from . import transport as http
from .errors import ConfigError, IdPUnavailable, TokenRejected

#: JWS alg -> (kty, crv or None)
ALG_KTY = {
    "RS256": ("RSA", None), "RS384": ("RSA", None), "RS512": ("RSA", None),
    "PS256": ("RSA", None), "PS384": ("RSA", None), "PS512": ("RSA", None),
    "ES256": ("EC", "P-256"), "ES384": ("EC", "P-384"), "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", None), "Ed25519": ("OKP", "Ed25519"),
}


#: Discovery endpoints this package uses; each must stay on the issuer's origin (transport.require_same_origin).
USED_ENDPOINTS = ("jwks_uri", "token_endpoint", "device_authorization_endpoint")


def key_fits(key: Dict[str, Any], alg: str) -> bool:
    """Whether a JWKS key can verify a signature made with ``alg`` (its type, curve and any ``alg`` it names)."""
    kty, crv = ALG_KTY[alg]
    if key.get("kty") != kty or (crv is not None and key.get("crv") != crv) or key.get("alg") not in (None, alg):
        return False
    return alg != "EdDSA" or key.get("crv") in ("Ed25519", "Ed448")


def usable_keys(keys: List[Dict[str, Any]], algorithms: List[str]) -> List[Dict[str, Any]]:
    """The keys that can verify a token signed with one of ``algorithms`` (a login's preflight needs one)."""
    return [k for k in keys if any(key_fits(k, a) for a in algorithms if a in ALG_KTY)]


def check_endpoints(meta: Dict[str, Any], issuer: str) -> Dict[str, Any]:
    """Refuse a discovery document whose endpoints (the ones used here) leave the issuer's scheme, host or port."""
    for k in USED_ENDPOINTS:
        if meta.get(k) is not None:
            http.require_same_origin(meta[k], issuer, f"discovery {k}")
    return meta


def public_keys_only(jwks: Any) -> List[Dict[str, Any]]:
    """Keep signature keys of type RSA/EC/OKP, drop private parts; never accept ``oct`` keys."""
    if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
        raise IdPUnavailable("JWKS document has no 'keys' list")
    out = []
    private = {"d", "p", "q", "dp", "dq", "qi", "oth", "k"}
    for k in jwks["keys"]:
        if not isinstance(k, dict) or k.get("kty") not in ("RSA", "EC", "OKP"):
            continue
        if k.get("use", "sig") != "sig":
            continue
        out.append({n: v for n, v in k.items() if n not in private})
    return out


#: The cache file holds one discovery document and one JWKS, each capped at transport.MAX_BODY.
MAX_CACHE_BYTES = 4 * 1024 * 1024
_FILE_RO = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a FIFO never hangs a login


def _makedirs(path: str) -> None:
    """Create ``path`` 0700 and its missing parents 0755 (os.makedirs gives parents 0777 less the umask, which is
    world-writable under umask 000)."""
    missing = []
    head = os.path.abspath(path)
    while not os.path.lexists(head):
        missing.append(head)
        head = os.path.dirname(head)
    for i, d in enumerate(reversed(missing)):
        final = i == len(missing) - 1
        try:
            os.mkdir(d, 0o700 if final else 0o755)
        except FileExistsError:
            continue  # made meanwhile: checked like any other below
        os.chmod(d, 0o700 if final else 0o755)  # the umask may have taken bits away; it never adds any


@overload
def open_private_dir(path: str, create: Literal[True]) -> int: ...


@overload
def open_private_dir(path: str, create: bool = False) -> Optional[int]: ...


def open_private_dir(path: str, create: bool = False) -> Optional[int]:
    """A descriptor of the cache directory after checking, on that descriptor, that it is a directory of ours and
    not group/other-writable (else :class:`ConfigError`). None when it does not exist and ``create`` is false.

    The directory itself is never reached through a symbolic link (a link planted in its place, pointing at a
    directory of ours such as /etc, would pass the owner check), and its parent must not be writable by others
    without the sticky bit (else the directory could be swapped). Missing parents are created 0755, whatever the
    umask adds, and the directory 0700."""
    try:
        if create:
            _makedirs(path)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        if not create:
            return None
        raise ConfigError("jwks_cache_dir", f"cannot create {path}: no such file or directory")
    except (NotADirectoryError, OSError) as e:
        if os.path.islink(path) or e.errno == errno.ELOOP:  # Linux says ENOTDIR for O_DIRECTORY | O_NOFOLLOW
            raise ConfigError("jwks_cache_dir", f"{path} is a symbolic link; give the directory itself")
        if isinstance(e, NotADirectoryError):
            raise ConfigError("jwks_cache_dir", f"{path} is not a directory")
        raise ConfigError("jwks_cache_dir", f"cannot {'create' if create else 'open'} {path}: {e.strerror}")
    try:
        pst = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        os.close(fd)
        raise ConfigError("jwks_cache_dir", f"cannot read the parent of {path}: {e.strerror}")
    if pst.st_mode & 0o002 and not pst.st_mode & stat.S_ISVTX:
        os.close(fd)
        raise ConfigError("jwks_cache_dir", f"the parent of {path} is writable by everyone (mode "
                                            f"{pst.st_mode & 0o777:o}) without the sticky bit")
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise ConfigError("jwks_cache_dir", f"{path} is owned by uid {st.st_uid}, not {os.geteuid()}")
        if st.st_mode & 0o022:
            raise ConfigError("jwks_cache_dir",
                              f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_file_problem(st: os.stat_result) -> Optional[str]:
    """Why an open file (its ``fstat``) is not a private regular file of ours with one link, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & 0o077:
        return f"readable or writable by others (mode {st.st_mode & 0o777:o})"
    if st.st_nlink != 1:
        return f"{st.st_nlink} hard links"
    return None


def atomic_write_json(path: str, data: Any, mode: int = 0o600) -> None:
    """``data`` as JSON (sorted keys) written atomically (fileutil.atomic_write)."""
    atomic_write(path, json.dumps(data, sort_keys=True), mode)


class JWKSCache:
    """Keys for one issuer, from memory, the disk cache or the IdP (in that order)."""

    def __init__(self, issuer: str, cache_dir: str, jwks_uri: Optional[str] = None, jwks_ttl: int = 3600,
                 metadata_ttl: int = 86400, max_stale: int = 7 * 86400, min_refresh_interval: int = 30,
                 http_timeout: float = 5.0, clock: Callable[[], float] = time.time,
                 log: Optional[Callable[[str], None]] = None):
        self.issuer = issuer
        self.cache_dir = cache_dir
        self.jwks_uri_override = jwks_uri
        self.jwks_ttl = jwks_ttl
        self.metadata_ttl = metadata_ttl
        self.max_stale = max_stale
        self.min_refresh_interval = min_refresh_interval
        self.http_timeout = http_timeout
        self.clock = clock
        self.log = log or (lambda _m: None)
        name = hashlib.sha256(issuer.encode("utf-8")).hexdigest()[:24]
        self.name = f"issuer-{name}.json"
        self.path = os.path.join(cache_dir, self.name)
        self.state: Optional[Dict[str, Any]] = None
        #: number of HTTP fetches this object made (for tests/benchmarks)
        self.fetches = 0

    @classmethod
    def from_config(cls, cfg: Any, log: Optional[Callable[[str], None]] = None) -> JWKSCache:
        return cls(cfg.issuer, cfg.jwks_cache_dir, cfg.jwks_uri, cfg.jwks_ttl, cfg.metadata_ttl, cfg.max_stale,
                   cfg.min_refresh_interval, cfg.http_timeout, log=log)

    # ---------------------------------------------------------------- disk
    def _load(self) -> Optional[Dict[str, Any]]:
        dfd = open_private_dir(self.cache_dir)  # checked on every read: a bad directory fails closed
        if dfd is None:
            return None
        try:
            try:
                fd = os.open(self.name, _FILE_RO, dir_fd=dfd)
            except FileNotFoundError:
                return None
            except OSError as e:  # ELOOP: a symlink; anything else: not ours to read
                self.log(f"ignoring cache file {self.path}: {e.strerror}")
                return None
            try:
                problem = private_file_problem(os.fstat(fd))
                if problem:
                    self.log(f"ignoring cache file {self.path}: {problem}")
                    return None
                raw = b""
                while len(raw) <= MAX_CACHE_BYTES:
                    chunk = os.read(fd, MAX_CACHE_BYTES + 1 - len(raw))
                    if not chunk:
                        break
                    raw += chunk
            finally:
                os.close(fd)
        except OSError as e:
            self.log(f"ignoring unreadable cache file {self.path}: {e.strerror}")
            return None
        finally:
            os.close(dfd)
        try:
            if len(raw) > MAX_CACHE_BYTES:
                raise ValueError("too large")
            data = http.json_loads(raw)
        except ValueError:
            self.log(f"ignoring unreadable cache file {self.path}")
            return None
        if not isinstance(data, dict) or data.get("issuer") != self.issuer or not isinstance(data.get("keys"), list):
            return None
        return data

    def _save(self, data: Dict[str, Any]) -> None:
        dfd = open_private_dir(self.cache_dir, create=True)
        tmp = f".tmp-{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(data, fh, sort_keys=True)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
        except OSError as e:
            self.log(f"cannot write cache {self.path}: {e}")
        finally:
            os.close(dfd)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        dfd = open_private_dir(self.cache_dir, create=True)
        try:
            try:
                fd = os.open(self.name + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dfd)
            except OSError as e:
                raise ConfigError("jwks_cache_dir", f"cannot open lock file {self.path}.lock: {e.strerror}")
        finally:
            os.close(dfd)
        try:
            problem = private_file_problem(os.fstat(fd))
            if problem:
                raise ConfigError("jwks_cache_dir", f"lock file {self.path}.lock is {problem}")
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- network
    def discovery_url(self) -> str:
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"

    def fetch_metadata(self) -> Dict[str, Any]:
        self.fetches += 1
        meta = http.get_json(self.discovery_url(), timeout=self.http_timeout)
        if not isinstance(meta, dict):
            raise IdPUnavailable("discovery document is not a JSON object")
        # OIDC Discovery 1.0 section 4.3: the document's issuer must be exactly ours.
        if meta.get("issuer") != self.issuer:
            raise IdPUnavailable(f"discovery issuer {ascii(meta.get('issuer'))[:100]} != configured {self.issuer!r}")
        return check_endpoints(meta, self.issuer)

    def _fetch_all(self, old: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        now = self.clock()
        meta = old.get("metadata") if old else None
        meta_at = old.get("metadata_fetched_at", 0) if old else 0
        if not self.jwks_uri_override and (not meta or now - meta_at > self.metadata_ttl):
            meta = self.fetch_metadata()
            meta_at = now
        uri = self.jwks_uri_override or (meta or {}).get("jwks_uri")
        if not isinstance(uri, str) or not uri:
            raise IdPUnavailable("discovery document has no jwks_uri")
        http.require_secure_url(uri, "jwks_uri")
        if not self.jwks_uri_override:
            http.require_same_origin(uri, self.issuer, "discovery jwks_uri")
        self.fetches += 1
        keys = public_keys_only(http.get_json(uri, timeout=self.http_timeout))
        return {"issuer": self.issuer, "metadata": meta, "metadata_fetched_at": meta_at, "keys": keys,
                "jwks_fetched_at": now, "refresh_attempt_at": now}

    # ---------------------------------------------------------------- API
    def seed(self, jwks: Dict[str, Any], metadata: Optional[Dict[str, Any]] = None) -> None:
        """Install keys obtained out of band (air-gapped sites, tests) as a fresh cache entry."""
        now = self.clock()
        st = {"issuer": self.issuer, "metadata": metadata, "metadata_fetched_at": now if metadata else 0,
              "keys": public_keys_only(jwks), "jwks_fetched_at": now, "refresh_attempt_at": now}
        with self._locked():
            self._save(st)
        self.state = st

    def metadata(self) -> Dict[str, Any]:
        """The discovery document (cached like the keys)."""
        st = self.get_state()
        if st.get("metadata"):
            return check_endpoints(st["metadata"], self.issuer)
        return self.fetch_metadata()

    def get_state(self, force: bool = False) -> Dict[str, Any]:
        """Return usable cached state, refreshing when stale; fail closed when nothing usable exists."""
        now = self.clock()
        st = self.state or self._load()
        if st is not None and not force and now - st.get("jwks_fetched_at", 0) <= self.jwks_ttl:
            self.state = st
            return st
        with self._locked():
            disk = self._load()  # another process may have refreshed while we waited
            if disk is not None and not force and now - disk.get("jwks_fetched_at", 0) <= self.jwks_ttl:
                self.state = disk
                return disk
            st = disk or st
            usable = st is not None and now - st.get("jwks_fetched_at", 0) <= self.jwks_ttl + self.max_stale
            if st is not None and usable and not force and \
                    now - st.get("refresh_attempt_at", 0) < self.min_refresh_interval:
                # stale, but a refresh was tried moments ago (IdP down?): do not make every login wait on it
                self.state = st
                return st
            if st is not None:
                st = dict(st, refresh_attempt_at=now)
                self._save(st)
            try:
                new = self._fetch_all(st)
            except IdPUnavailable as e:
                if st is not None and usable:
                    self.log(f"IdP unreachable ({e.reason}); using cached keys from "
                             f"{int(now - st.get('jwks_fetched_at', 0))} s ago")
                    self.state = st
                    return st
                raise IdPUnavailable(f"no usable signing keys: {e.reason}")
            self._save(new)
            self.state = new
            return new

    def _refresh_for_unknown_kid(self, kid: str) -> Optional[Dict[str, Any]]:
        with self._locked():
            st = self._load() or self.state
            now = self.clock()
            last = st.get("refresh_attempt_at", 0) if st else 0
            if st is not None and any(k.get("kid") == kid for k in st["keys"]):
                self.state = st
                return st  # another process already fetched it
            if st is not None and now - last < self.min_refresh_interval:
                self.log(f"unknown kid {kid!r}: refresh skipped (last attempt {int(now - last)} s ago, "
                         f"min_refresh_interval {self.min_refresh_interval} s)")
                return None
            if st is not None:
                st = dict(st)
                st["refresh_attempt_at"] = now
                self._save(st)  # stamp first: concurrent forged kids see it and do not fetch
                self.state = st
            try:
                new = self._fetch_all(st)
            except IdPUnavailable as e:
                self.log(f"unknown kid {kid!r}: refresh failed: {e.reason}")
                return None
            self._save(new)
            self.state = new
            self.log(f"unknown kid {kid!r}: JWKS refreshed ({len(new['keys'])} keys)")
            return new

    def find_key(self, kid: Optional[str], alg: str) -> Dict[str, Any]:
        """The public JWK for ``kid`` that fits ``alg``; one rate-limited refresh for an unknown kid."""
        kty, crv = ALG_KTY[alg]
        st = self.get_state()
        key = self._select(st["keys"], kid, kty, crv, alg)
        if key is None and kid is not None:
            st2 = self._refresh_for_unknown_kid(kid)
            if st2 is not None:
                key = self._select(st2["keys"], kid, kty, crv, alg)
        if key is None:
            raise TokenRejected(f"unknown signing key (kid={kid!r}, alg={alg})")
        return key

    @staticmethod
    def _select(keys: List[Dict[str, Any]], kid: Optional[str], kty: str, crv: Optional[str],
                alg: str) -> Optional[Dict[str, Any]]:
        cands = [k for k in keys if key_fits(k, alg)]
        if kid is not None:
            cands = [k for k in cands if k.get("kid") == kid]
        elif len(cands) != 1:
            return None  # no kid: only unambiguous when exactly one key could fit
        return cands[0] if cands else None
