# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one path every front end (CLI, PAM) takes: validate, then authorise. Plus logging."""
from __future__ import annotations

import os
import stat
import time
from typing import Any, Callable, Dict, Optional, Tuple

from . import transport
from .config import OIDCConfig
from .device import DeviceGrant
from .jwks import JWKSCache
from .policy import authorise
from .validator import TokenValidator

Logger = Callable[[str], None]


def file_logger(path: Optional[str], prefix: str = "gpufleet-oidc") -> Logger:
    """Append one line per event to ``path`` (0600). Never log tokens, only reasons.

    The PAM module runs as root inside sshd: the file is opened with O_NOFOLLOW, so a symlink planted at ``path``
    is refused (the line is dropped) instead of appending to whatever it points at; O_NONBLOCK and an ``fstat`` of
    the open descriptor refuse a FIFO, device or socket planted there (no hang, nothing written to a reader) and a
    file of another owner or with more than one link; O_CLOEXEC keeps the descriptor out of any process sshd
    starts.
    """

    def log(msg: str) -> None:
        if not path:
            return
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {prefix}[{os.getpid()}]: {msg}\n"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         0o600)
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
                    os.write(fd, line.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            pass

    return log


class Authenticator:
    def __init__(self, cfg: OIDCConfig, log: Optional[Logger] = None):
        self.cfg = cfg
        self.log = log or file_logger(cfg.log_file)
        transport.configure(cfg.proxy)
        self.keys = JWKSCache.from_config(cfg, log=self.log)
        self.validator = TokenValidator(cfg, self.keys, log=self.log)

    def check_token(self, token: Any, login_user: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
        """Validated, authorised token -> (local user, claims). Raises an OIDCError otherwise."""
        claims = self.validator.validate(token)
        user = authorise(self.cfg, claims, login_user)
        return user, claims

    def device_grant(self, **kw: Any) -> DeviceGrant:
        cfg = self.cfg
        if not cfg.client_id:
            from .errors import ConfigError

            raise ConfigError("client_id", "required for the device grant")
        meta = self.keys.metadata()
        return DeviceGrant(meta, cfg.client_id, cfg.client_secret, cfg.scope, cfg.resource, cfg.http_timeout, **kw)

    def token_from_response(self, token_response: Dict[str, Any]) -> Any:
        return token_response.get(self.cfg.validate_token)
