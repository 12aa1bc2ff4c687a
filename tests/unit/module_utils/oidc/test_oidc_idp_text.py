"""What a hostile IdP may put in front of the user or into the discovery document: terminal text is cleaned and
bounded; endpoints must stay on the issuer's origin."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import transport
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.device import display_text
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import IdPUnavailable
from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import check_endpoints


@pytest.mark.parametrize("raw, shown", [
    ("ABCD-EFGH", "ABCD-EFGH"),
    ("\x1b[2J\x1b[HABCD", "ABCD"),  # clear screen, cursor home
    ("AB\x1b]0;owned title\x07CD", "ABCD"),  # OSC window title, BEL-terminated
    ("AB\x1b]8;;https://evil.example/\x1b\\CD", "ABCD"),  # OSC 8 hyperlink, ST-terminated
    ("AB\x9b31mCD", "ABCD"),  # 8-bit CSI
    ("AB\x1bcCD", "ABCD"),  # RIS (full reset)
    ("AB\r\nPassword: ", "ABPassword: "),  # a fake prompt on a new line
    ("AB\u202eDC", "ABDC"),  # RIGHT-TO-LEFT OVERRIDE
    ("AB\u2028CD\x00\x7f", "ABCD"),
    ("Anmelden bei Contoso", "Anmelden bei Contoso"),  # localised text stays
])
def test_display_text(raw, shown):
    assert display_text(raw) == shown


def test_display_text_bounded():
    assert len(display_text("A" * 10_000_000, 64)) == 64
    out = display_text("\x1b[" + "9" * 100_000 + "m" + "X", 10)  # a sequence longer than the input bound
    assert "\x1b" not in out and len(out) <= 10


ISS = "https://sso.example.com/realms/hpc"


@pytest.mark.parametrize("url, ok", [
    ("https://sso.example.com/realms/hpc/protocol/openid-connect/token", True),
    ("https://SSO.example.com:443/token", True),
    ("https://sso.example.com:8443/token", False),
    ("https://evil.example/token", False),
    ("https://sso.example.com.evil.example/token", False),
    ("https://sso.example.com@evil.example/token", False),
    ("http://sso.example.com/token", False),
    ("http://127.0.0.1:8080/token", False),  # loopback port: any local user could listen there
    ("https://sso.example.com/tok\x1b[2Jen", False),
    ("https://sso.example.com:x/token", False),
    ("https://sso.example.com/" + "a" * 3000, False),
    (None, False),
])
def test_same_origin_rule(url, ok):
    if ok:
        assert transport.require_same_origin(url, ISS, "token_endpoint") == url
    else:
        with pytest.raises(IdPUnavailable, match="leaves the issuer's origin"):
            transport.require_same_origin(url, ISS, "token_endpoint")


def test_loopback_issuer_keeps_its_port():
    iss = "http://127.0.0.1:8080"
    transport.require_same_origin("http://127.0.0.1:8080/jwks", iss, "jwks_uri")
    for bad in ("http://127.0.0.1:8081/jwks", "http://localhost:8080/jwks", "https://127.0.0.1:8080/jwks"):
        with pytest.raises(IdPUnavailable):
            transport.require_same_origin(bad, iss, "jwks_uri")


def test_check_endpoints_only_the_used_ones():
    meta = {"issuer": ISS, "jwks_uri": ISS + "/certs", "token_endpoint": ISS + "/token",
            "device_authorization_endpoint": ISS + "/device",
            "userinfo_endpoint": "https://graph.microsoft.com/oidc/userinfo"}  # Entra does this: not used here
    assert check_endpoints(meta, ISS) is meta
    for k in ("jwks_uri", "token_endpoint", "device_authorization_endpoint"):
        with pytest.raises(IdPUnavailable, match=f"discovery {k}"):
            check_endpoints(dict(meta, **{k: "https://evil.example/x"}), ISS)
