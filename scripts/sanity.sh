#!/usr/bin/env bash
# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Runs `ansible-test sanity --venv` on a copy of the collection laid out where ansible-test wants it
# (/tmp/gpufleet-build-*/ansible_collections/gpufleet/reliability), on every target Python this machine has (3.9+).
# The copy holds exactly the files git tracks or would track, so nothing built (.venv, node_modules) is linted.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# Outside the checkout: inside it, ansible-test would take its file list from the enclosing git work tree.
build=${GPUFLEET_BUILD_DIR:-/tmp/gpufleet-build-$(printf %s "$repo" | md5sum | cut -c1-8)}
dest="$build/ansible_collections/gpufleet/reliability"
pybin="$build/pybin"
rm -rf "$dest"
mkdir -p "$dest" "$pybin"
cd "$repo"
git ls-files -co --exclude-standard -z | rsync -a --from0 --files-from=- ./ "$dest/"
# Only the real interpreters go on PATH (pyenv's shims print "command not found" for versions not selected).
pythons=()
for v in 3.9 3.10 3.11 3.12 3.13; do
  for cand in /root/.pyenv/versions/"$v".*/bin/python"$v" /usr/bin/python"$v"; do
    if [ -x "$cand" ]; then ln -sfn "$cand" "$pybin/python$v"; pythons+=("$v"); break; fi
  done
done
echo "sanity: target Pythons ${pythons[*]}"
cd "$dest"
PATH="$pybin:$repo/.venv/bin:$PATH" "$repo/.venv/bin/ansible-test" sanity --venv --color no "$@"
