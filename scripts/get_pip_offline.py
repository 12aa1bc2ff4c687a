# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Stand-in for ansible-test's downloaded get-pip.py (the download host is not reachable here):
# bootstrap pip with ensurepip in a subprocess (so /etc/pip.conf still applies), then run pip with
# the arguments ansible-test passes.
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.run([sys.executable, "-m", "ensurepip", "--upgrade"], check=True, stdout=subprocess.DEVNULL)
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
