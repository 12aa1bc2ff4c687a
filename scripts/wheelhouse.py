# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""`make wheelhouse`: the wheels every node venv of the roles needs, for nodes that cannot reach a package index.

The pins are read where the roles read them: requirements/node.txt (gpu_health's nvidia-ml-py) and the
oidc_login role's ``oidc_login_pip_packages`` default. pip downloads binary wheels only, with their dependencies,
for the nodes' Python version and platform (not this machine's), into DEST, and writes SHA256SUMS beside them.
Point the roles at DEST (``gpu_health_wheelhouse``, ``oidc_login_wheelhouse``): they copy it to the node and
install with ``pip --no-index --find-links``, so the node never asks an index.

Usage: python scripts/wheelhouse.py [--python-version 3.9] [--platform manylinux2014_x86_64] [--dest DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+$")


def pins(repo: Path = REPO) -> list[str]:
    """Every pin a role installs on a node, in order, each ``name==version``."""
    out = []
    for line in (repo / "requirements" / "node.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    defaults = yaml.safe_load((repo / "roles" / "oidc_login" / "defaults" / "main.yml").read_text())
    out.extend(defaults["oidc_login_pip_packages"])
    bad = [p for p in out if not isinstance(p, str) or not PIN.match(p)]
    if bad:
        raise SystemExit(f"wheelhouse: expected pins name==version, got {bad}")
    return out


def build(dest: Path, python_version: str, platform: str, pip: list[str] | None = None) -> list[str]:
    """Download the wheels into ``dest`` (replaced whole, only once every download succeeded) and write SHA256SUMS.
    Returns the wheel file names."""
    if not re.fullmatch(r"3\.[0-9]{1,2}", python_version):
        raise SystemExit(f"wheelhouse: --python-version: expected 3.N, got {python_version!r}")
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        argv = (pip or [sys.executable, "-m", "pip"]) + [
            "download", "--disable-pip-version-check", "--only-binary=:all:", "--python-version", python_version,
            "--platform", platform, "--implementation", "cp", "--dest", str(work), *pins()]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"wheelhouse: pip download failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}")
        wheels = sorted(p.name for p in work.iterdir() if p.suffix == ".whl")
        sums = "".join(f"{hashlib.sha256((work / w).read_bytes()).hexdigest()}  {w}\n" for w in wheels)
        (work / "SHA256SUMS").write_text(sums)
        for p in work.iterdir():
            os.chmod(p, 0o644)
        os.chmod(work, 0o755)
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if dest.exists():
            dest.rename(old)
        work.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
        return wheels
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--python-version", default="3.9", help="the nodes' Python, 3.N (default 3.9: RHEL 9)")
    ap.add_argument("--platform", default="manylinux2014_x86_64",
                    help="the nodes' wheel platform tag (default manylinux2014_x86_64; manylinux2014_aarch64 for Arm)")
    ap.add_argument("--dest", type=Path, default=None,
                    help="where the wheels go (default dist/wheelhouse-<python>-<platform>)")
    args = ap.parse_args(argv)
    dest = args.dest or REPO / "dist" / f"wheelhouse-py{args.python_version}-{args.platform}"
    wheels = build(dest, args.python_version, args.platform)
    print(f"wheelhouse: {len(wheels)} wheels for Python {args.python_version} on {args.platform} in {dest}")
    for w in wheels:
        print(f"  {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
