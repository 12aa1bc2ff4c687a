# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures of the OIDC integration tests; the helpers live in tests/support/oidclab.py."""
from support.oidclab import (
    idp_factory,
    local_users,
    module_idp,
    pam_env,
    sshd_factory,
)

# Re-exported so that pytest finds these fixtures in this directory's conftest.
__all__ = ["idp_factory", "local_users", "module_idp", "pam_env", "sshd_factory"]
