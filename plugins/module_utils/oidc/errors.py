# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Exception types. Each carries a short machine reason and maps onto one PAM result."""
from __future__ import annotations


class OIDCError(Exception):
    """Base class. ``reason`` is a short, loggable text (never contains a token)."""

    #: name of the PAM result this failure maps to (looked up on the pam handle)
    pam_result = "PAM_AUTH_ERR"
    #: exit status of the CLI
    exit_code = 1

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ConfigError(OIDCError):
    """The configuration file is missing, unreadable or invalid. ``key`` names the bad setting."""

    pam_result = "PAM_SERVICE_ERR"
    exit_code = 2

    def __init__(self, key: str, reason: str):
        super().__init__(f"config key '{key}': {reason}" if key else reason)
        self.key = key


class TokenRejected(OIDCError):
    """The token is not valid (signature, claims, format)."""

    exit_code = 3


class NotAuthorised(OIDCError):
    """The token is valid but the user mapping or the group gate refuses it."""

    exit_code = 4


class IdPUnavailable(OIDCError):
    """The IdP cannot be reached and no usable cached data exists: fail closed."""

    pam_result = "PAM_AUTHINFO_UNAVAIL"
    exit_code = 5


class DeviceFlowError(OIDCError):
    """The device grant ended without a token (denied, expired, deadline, protocol error)."""

    exit_code = 6
