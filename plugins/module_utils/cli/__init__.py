# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The command-line bodies: thin front ends that parse options, call the brain and its adapters, and report.

* ``health_agent`` - ``gpufleet-health``, the node agent (HealthCheckProgram, systemd timer).
* ``oidc`` - ``gpufleet-oidc``, the OIDC token tools (validate, device login, JWKS for Slurm).
* ``startup`` - ``gpufleet-startup``, the command line of the node startup runner (``startup.runner``).

Bodies import the brain (``health``, ``repair``), the adapters (``slurm``, ``nvml``, ``kmsg``, ``nodeinfo``) and
the cores (``oidc``, ``startup``); nothing there imports a body back (a unit test walks the imports). A rule
lives in the brain once; a body only translates between the command line, the files and the brain.
"""
from __future__ import annotations
