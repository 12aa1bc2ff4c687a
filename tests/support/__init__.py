# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers shared by tests in more than one directory (and by tests/fuzz/run.py and the benchmarks).

``tests/`` is on the tests' import path (pytest's ``pythonpath``), so a test imports ``from support.timing import
deadline``; a standalone script (tests/fuzz/run.py, benchmarks/bench_oidc.py, the monitoring lab's health hook)
puts ``tests/`` on ``sys.path`` itself. Nothing here is collected as a test, and importing the package imports
none of its modules.

* ``timing``: ``deadline(seconds)``, fail instead of hanging (SIGALRM).
* ``ansible_cli``: ``run_module``, one module through ``ansible localhost -m ... -o``, in a private Ansible home.
* ``oidc_forge``: real keys and tokens, forged ones, and ``serve_json`` (a JWKS endpoint on loopback).
* ``oidclab``: the OIDC lab (oidc-provider, PAM, sshd) for the integration tests.
* ``repair_lab`` and ``fakegpu``: the repair lab on the Slurm lab, and its GPU stand-in (also run as a script).
* ``labs``: the Slurm lab factory (a port block, a directory and an owner token per lab).
* ``shared``: machine-wide things several test processes use at once (the test users, /run/sshd).
* ``fuzz_engine`` and ``fuzz_targets``: the fuzz harnesses (tests/fuzz/run.py runs them in full, the unit suite
  a smoke of each).
"""
