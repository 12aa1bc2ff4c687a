# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""OIDC core for SSH/PAM logins and Slurm REST auth.

Pure library code: discovery, an on-disk JWKS cache, a strict JWT validator (joserfc), the
claims -> local user policy, an RFC 8628 device-grant client (authlib) and the PAM glue.
Every sub-module uses relative imports only; the roles copy it, with what it imports, under the node's lib
directory in the collection's layout.
"""
from __future__ import annotations
