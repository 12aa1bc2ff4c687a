# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The oidc_login role's undo record (roles/oidc_login/files/gpufleet-oidc-txn): a rollback puts back what was
there, removes what the role created and says so; when it cannot finish it goes on with the rest, names every path
it could not restore, exits 3 and keeps the record (the role's failure message quotes it)."""
import subprocess
from pathlib import Path

TXN = Path(__file__).resolve().parents[3] / "roles" / "oidc_login" / "files" / "gpufleet-oidc-txn"


def txn(*args):
    return subprocess.run(["bash", str(TXN), *map(str, args)], capture_output=True, text=True, timeout=60,
                          check=False)


def test_rollback_puts_back_removes_and_says_so(tmp_path):
    conf = tmp_path / "etc" / "sshd_config"
    conf.parent.mkdir()
    conf.write_text("Port 22\n")
    conf.chmod(0o600)
    dropin = tmp_path / "etc" / "sshd_config.d" / "gpufleet-oidc.conf"
    undo = tmp_path / "undo"
    assert txn("snapshot", undo, conf, dropin).returncode == 0
    conf.write_text("Include /etc/ssh/sshd_config.d/*.conf\nPort 22\n")
    dropin.parent.mkdir()
    dropin.write_text("KbdInteractiveAuthentication yes\n")
    r = txn("rollback", undo)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "rolled back: 1 path(s) put back as they were, 1 path(s) the role created removed"
    assert conf.read_text() == "Port 22\n" and conf.stat().st_mode & 0o777 == 0o600
    assert not dropin.parent.exists()


def test_a_rollback_that_cannot_finish_names_what_it_did_not_restore(tmp_path):
    pam = tmp_path / "pam.d"
    pam.mkdir()
    (pam / "sshd").write_text("@include common-auth\n")
    (pam / "other").write_text("@include common-other\n")
    undo = tmp_path / "undo"
    assert txn("snapshot", undo, pam / "sshd", pam / "other").returncode == 0
    (pam / "sshd").unlink()
    (pam / "other").write_text("changed\n")
    sshd_blocked = pam / "sshd"
    sshd_blocked.mkdir()  # a directory where the file was: tar cannot put the file back
    (sshd_blocked / "x").write_text("")
    r = txn("rollback", undo)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "rollback INCOMPLETE: 1 path(s) put back" in r.stderr, r.stderr
    assert f"[{pam / 'sshd'}: not put back (Cannot open: " in r.stderr, r.stderr
    assert f"the undo record is kept in {undo}" in r.stderr
    assert (pam / "other").read_text() == "@include common-other\n"  # the rest was put back all the same
    assert (undo / "before.tar").is_file()
