# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# slurm_conf's `current` result: how the slurm_reliability role reads what a site already has (HealthCheckProgram,
# Epilog, PrologFlags, Include lines) before it decides to chain, refuse or replace.
from pathlib import Path

from ansible_collections.gpufleet.reliability.plugins.module_utils.slurmconf import ConfFile

MODULE = "gpufleet.reliability.slurm_conf"

SITE = """\
# templated by the site's own tool
clustername=site
healthcheckprogram=/usr/sbin/nhc   # NHC
Epilog=/etc/slurm/epilog.sh
NodeName=n[1-2] CPUs=4 State=UNKNOWN
include /etc/slurm/gpufleet-reliability.conf
PrologFlags=Contain,X11 \\
  # continued
Epilog=/etc/slurm/epilog2.sh
"""


def test_outline_keeps_file_order_spells_keys_and_lists_includes():
    conf = ConfFile(SITE, "slurm")
    assert conf.outline() == [
        ("ClusterName", "site"), ("HealthCheckProgram", "/usr/sbin/nhc"), ("Epilog", "/etc/slurm/epilog.sh"),
        ("Include", "/etc/slurm/gpufleet-reliability.conf"), ("PrologFlags", "Contain,X11"),
        ("Epilog", "/etc/slurm/epilog2.sh")]


def test_module_reads_without_writing_and_reports_before_values(localhost, tmp_path: Path):
    # The Include resolves: after a change the module asks the host's `scontrol --version`, which reads this
    # slurm.conf, and Slurm retries an include it cannot open for up to a minute before it gives up.
    included = tmp_path / "gpufleet-reliability.conf"
    included.write_text("# the role's own settings\n")
    site = SITE.replace("include /etc/slurm/gpufleet-reliability.conf", f"include {included}")
    assert site != SITE
    path = tmp_path / "slurm.conf"
    path.write_text(site)
    res = getattr(localhost, MODULE)(path=str(path))["localhost"]
    assert res.is_successful and res["changed"] is False, res
    assert {"key": "Include", "value": str(included)} in res["current"]
    epilogs = [i["value"] for i in res["current"] if i["key"] == "Epilog"]
    assert epilogs == ["/etc/slurm/epilog.sh", "/etc/slurm/epilog2.sh"]
    assert path.read_text() == site
    # after a change, `current` still shows the values from before it
    res = getattr(localhost, MODULE)(path=str(path), settings={"HealthCheckProgram": "/opt/x"})["localhost"]
    assert res["changed"] is True
    assert {"key": "HealthCheckProgram", "value": "/usr/sbin/nhc"} in res["current"]
    missing = getattr(localhost, MODULE)(path=str(tmp_path / "new.conf"), kind="slurm", create=True)["localhost"]
    assert missing["current"] == []
