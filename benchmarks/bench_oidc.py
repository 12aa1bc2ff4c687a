# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Cost of OIDC token validation: warm (in-process), warm-from-disk (new cache object, as each login process
has), and the whole `gpufleet-oidc validate` process (interpreter start and imports included), plus the
rejection of hostile tokens. No IdP needed: the cache is seeded with real keys.

Prints figures; asserts nothing. Usage: python benchmarks/bench_oidc.py [N]   (median of N; default 15)
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "tests"))  # the test forge: tests/support/oidc_forge.py

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import parse_config  # noqa: E402
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import TokenRejected  # noqa: E402
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import JWKSCache  # noqa: E402
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import TokenValidator  # noqa: E402
from support.oidc_forge import AUD, ISSUER, claims_for, make_private_jwks, public_jwks, sign, unsigned  # noqa: E402


def med_ms(fn, n):
    out = []
    for _unused in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    tmp = Path(tempfile.mkdtemp(prefix="bench-oidc-"))
    conf = {"issuer": ISSUER, "audience": AUD, "username_claim": "preferred_username", "groups_claim": "groups",
            "allowed_groups": ["hpc-users"], "jwks_cache_dir": str(tmp / "cache"), "http_timeout": 1}
    cfg = parse_config(conf)
    priv = make_private_jwks(1)
    JWKSCache.from_config(cfg).seed(public_jwks(priv))
    rs = sign(priv, claims_for(ISSUER, AUD), "rs-1")
    es = sign(priv, claims_for(ISSUER, AUD), "es-1")
    v = TokenValidator(cfg, JWKSCache.from_config(cfg))
    v.validate(rs)
    print(f"warm validate RS256 ({len(rs)} chars): {med_ms(lambda: v.validate(rs), n * 20):.3f} ms")
    print(f"warm validate ES256 ({len(es)} chars): {med_ms(lambda: v.validate(es), n * 20):.3f} ms")
    print(f"validate with a fresh cache object (reads the cache file): "
          f"{med_ms(lambda: TokenValidator(cfg, JWKSCache.from_config(cfg)).validate(rs), n * 5):.3f} ms")

    def reject(tok):
        try:
            v.validate(tok)
        except TokenRejected:
            return
        raise AssertionError("accepted")

    none = unsigned(claims_for(ISSUER, AUD))
    print(f"reject alg=none: {med_ms(lambda: reject(none), n * 20):.3f} ms")
    bad = rs[:-4] + ("AAAA" if not rs.endswith("AAAA") else "BBBB")
    print(f"reject bad signature: {med_ms(lambda: reject(bad), n * 20):.3f} ms")
    import yaml

    (tmp / "c.yml").write_text(yaml.safe_dump(conf))
    cli = [str(Path(sys.prefix) / "bin" / "gpufleet-oidc"), "validate", "--config", str(tmp / "c.yml")]
    print(f"gpufleet-oidc validate process: "
          f"{med_ms(lambda: subprocess.run(cli, input=rs, capture_output=True, text=True, check=True), n):.0f} ms")


if __name__ == "__main__":
    main()
