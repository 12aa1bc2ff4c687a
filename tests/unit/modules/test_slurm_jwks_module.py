# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurm_jwks for real through Ansible (pytest-ansible's `localhost`) against a JWKS served on loopback: what it
writes, and a diff that shows what changes (content, mode) and nothing else."""
from __future__ import annotations

import json
import os
import stat

import pytest

from support.oidc_forge import serve_json

JWKS = {"keys": [{"kty": "RSA", "kid": "rs-1", "use": "sig", "alg": "RS256", "n": "sXch", "e": "AQAB"},
                 {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"}]}  # a symmetric key Slurm must never get


@pytest.fixture
def jwks_uri():
    with serve_json(JWKS) as url:
        yield url


def run(localhost, **kw):
    return getattr(localhost, "gpufleet.reliability.slurm_jwks")(**kw)["localhost"]


def test_writes_then_unchanged_and_diff_shows_only_what_changes(localhost, tmp_path, jwks_uri):
    dest = tmp_path / "jwks.json"
    res = run(localhost, jwks_uri=jwks_uri, dest=str(dest))
    assert res["changed"] is True and res["kids"] == ["rs-1"], res
    written = dest.read_text()
    assert [k["kid"] for k in json.loads(written)["keys"]] == ["rs-1"]
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o400
    (entry,) = res["diff"]
    assert entry == {"before_header": str(dest), "after_header": str(dest), "before": "", "after": written}

    assert run(localhost, jwks_uri=jwks_uri, dest=str(dest))["changed"] is False

    # a mode-only change: the diff names the mode, not an identical content
    os.chmod(dest, 0o644)
    res = run(localhost, jwks_uri=jwks_uri, dest=str(dest))
    assert res["changed"] is True
    assert res["diff"] == [{"before_header": f"{dest} (mode)", "after_header": f"{dest} (mode)",
                            "before": "0644\n", "after": "0400\n"}]
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o400 and dest.read_text() == written

    # the same keys written another way are not rewritten, so the diff shows no content change either
    os.chmod(dest, 0o600)
    dest.write_text(json.dumps(json.loads(written)))
    res = run(localhost, jwks_uri=jwks_uri, dest=str(dest))
    assert [d["before_header"] for d in res["diff"]] == [f"{dest} (mode)"]
    assert dest.read_text() == json.dumps(json.loads(written))
