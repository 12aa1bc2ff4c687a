# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Shared test set-up. The collection is importable as ansible_collections.gpufleet.reliability through
# ./collections (made by `make setup`); modules run through Ansible find it through ANSIBLE_COLLECTIONS_PATH.
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / "collections"
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS))
os.environ.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))
# Modules run with the interpreter of the tests, never an interpreter found by discovery (pyenv shims).
os.environ.setdefault("ANSIBLE_PYTHON_INTERPRETER", sys.executable)
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

FIXTURES = REPO / "tests" / "fixtures"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
