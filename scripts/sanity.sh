#!/usr/bin/env bash
# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Runs `ansible-test sanity --venv` on a copy of the collection laid out where ansible-test wants it
# (/tmp/gpufleet-build-*/ansible_collections/gpufleet/reliability), on every target Python this machine has (3.9+).
# The copy holds exactly the files git tracks or would track, so nothing built (.venv, node_modules) is linted.
# GPUFLEET_SANITY_VENV picks the venv whose ansible-test runs (default .venv: ansible-core 2.19; the 2.21 lane
# passes its own), relative to the checkout or absolute.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${GPUFLEET_SANITY_VENV:-.venv}
[[ "$venv" == /* ]] || venv="$repo/$venv"
[[ -x "$venv/bin/ansible-test" ]] || { echo "sanity: no ansible-test in $venv (make setup)" >&2; exit 1; }
# Outside the checkout: inside it, ansible-test would take its file list from the enclosing git work tree.
# One tree per checkout and venv, so that two lanes can run at once.
build=${GPUFLEET_BUILD_DIR:-/tmp/gpufleet-build-$(printf %s "$repo:$venv" | md5sum | cut -c1-8)}
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
# ansible-test keeps its pip bootstrap script and its sanity venvs under ~/.ansible/test: give it a home of its own,
# never the user's ~/.ansible. The venvs are a cache, like pip's: kept per ansible-core version under
# ~/.cache/gpufleet (GPUFLEET_ANSIBLE_TEST_HOME overrides), so a fresh clone on a machine that ran sanity before
# does not build them again (5.5 min cold, 1.9 min warm for the 2.19 run). Delete it at any time. Its pip
# bootstrap host is not reachable, so the stand-in goes there under the name of the pip version this ansible-test
# asks for.
core=$("$venv/bin/python" -c 'from ansible.release import __version__; print(__version__)')
home=${GPUFLEET_ANSIBLE_TEST_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/ansible-test-$core}
mkdir -p "$home/.ansible/test/cache"
pip_versions=$(grep -ho "pip='[0-9.]*'" "$venv"/lib/python3*/site-packages/ansible_test/_internal/python_requirements.py \
  | sed "s/^pip='//; s/'$//")
[ -n "$pip_versions" ] || { echo "sanity: cannot find the pip version ansible-test bootstraps" >&2; exit 1; }
for v in $pip_versions; do cp "$repo/scripts/get_pip_offline.py" "$home/.ansible/test/cache/get_pip_${v//./_}.py"; done
# pip keeps the user's cache and configuration
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}"
if [ -z "${PIP_CONFIG_FILE:-}" ] && [ -f "$HOME/.config/pip/pip.conf" ]; then export PIP_CONFIG_FILE="$HOME/.config/pip/pip.conf"; fi
version=$("$venv/bin/ansible" --version)  # whole output: a pipe into head would break ansible's write
echo "sanity: ${version%%$'\n'*}, target Pythons ${pythons[*]}"
cd "$dest"
HOME="$home" PATH="$pybin:$venv/bin:$PATH" "$venv/bin/ansible-test" sanity --venv --color no "$@"
