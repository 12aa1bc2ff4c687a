# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An ID token must not work as an access token by accident (nor the reverse), even with a lazy configuration
whose audience is the client id: real tokens from the test IdP through the CLI."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.oidclab import PREFIX, approve, write_config

pytestmark = pytest.mark.idp
CLI = str(Path(sys.prefix) / "bin" / "gpufleet-oidc")
ALICE = f"{PREFIX}alice"


def _part(token: str, i: int) -> dict:
    p = token.split(".")[i]
    return json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))


@pytest.fixture(scope="module")
def token_pair(module_idp, tmp_path_factory):
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import load_config
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.core import Authenticator

    tmp = tmp_path_factory.mktemp("kind")
    auth = Authenticator(load_config(str(write_config(tmp / "c.yml", module_idp.issuer, tmp / "cache"))))
    dg = auth.device_grant()
    grant = dg.start()
    assert approve(grant["verification_uri_complete"], ALICE) == "Sign-in Success"
    tokens = dg.poll(grant, 20)
    return tokens["access_token"], tokens["id_token"]


def _cli(cfg: Path, token: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "validate", "--config", str(cfg)], input=token, capture_output=True, text=True,
                          timeout=60, check=False)


def test_id_token_refused_as_access_token(module_idp, token_pair, tmp_path):
    """This IdP types its access tokens (RFC 9068 at+jwt) but not its ID tokens, which carry no at_hash in the
    device grant: required_typ is the knob that tells them apart."""
    at, idt = token_pair
    assert _part(at, 0).get("typ") == "at+jwt" and "typ" not in _part(idt, 0)  # what the IdP really issues
    # lazy configuration: audience includes the client id, so the ID token's aud matches
    lazy = write_config(tmp_path / "lazy.yml", module_idp.issuer, tmp_path / "cache",
                        audience=["gpufleet-device", "urn:gpufleet:ssh"], required_typ=["at+jwt"])
    r = _cli(lazy, idt)
    assert r.returncode == 3 and "token type 'None' not accepted" in r.stderr, r.stderr
    r = _cli(lazy, at)
    assert (r.returncode, r.stdout.strip()) == (0, ALICE), r.stderr  # control


def test_access_token_refused_as_id_token(module_idp, token_pair, tmp_path):
    at, idt = token_pair
    cfg = write_config(tmp_path / "id.yml", module_idp.issuer, tmp_path / "cache",
                       audience=["gpufleet-device", "urn:gpufleet:ssh"], validate_token="id_token")
    r = _cli(cfg, at)
    assert r.returncode == 3 and "an access token (typ 'at+jwt') is not accepted as id_token" in r.stderr, r.stderr
    r = _cli(cfg, idt)
    assert (r.returncode, r.stdout.strip()) == (0, ALICE), r.stderr  # control
