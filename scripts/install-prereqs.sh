#!/usr/bin/env bash
# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Installs the Debian packages listed in scripts/apt-packages.txt that are missing. Daemons that the
# packages' postinst would start are kept from starting (policy-rc.d), so nothing runs with the
# system's configs: the tests start their own daemons in private directories.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mapfile -t pkgs < <(grep -vE '^\s*(#|$)' "$here/apt-packages.txt")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install-prereqs: missing Debian packages (${missing[*]}) and not root: install them first" >&2
  exit 1
fi
made_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  made_policy=1
fi
cleanup() { if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT
echo "install-prereqs: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/gpufleet-apt.log 2>&1 || {
  cat /tmp/gpufleet-apt.log >&2
  exit 1
}
