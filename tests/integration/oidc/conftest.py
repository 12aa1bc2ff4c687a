"""Fixtures of the OIDC integration tests; the helpers live in oidclab.py (a unique module name)."""
from oidclab import (  # noqa: F401 - pytest fixtures
    idp_factory,
    local_users,
    module_idp,
    pam_env,
    run_sshd_dir,
    sshd_factory,
)
