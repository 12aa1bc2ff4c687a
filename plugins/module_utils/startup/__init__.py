# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node startup scripts: metadata (scripts.py) and the runner (runner.py; its command line is cli/startup.py)."""
from __future__ import annotations
