# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Atomic file writes, the one helper every writer of this collection uses (stdlib only, Python 3.9+).

A reader sees the old file or the new one, never a half-written one: the data goes to a temporary file in the
same directory, is flushed and fsync'ed, gets its mode (and, if asked, the old file's owner), and replaces the
target with os.replace. On any error the temporary file is removed and the target is untouched.
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional, Union


def atomic_write(
    path: Union[str, os.PathLike[str]],
    data: Union[str, bytes],
    mode: Optional[int] = 0o644,
    *,
    makedirs: bool = False,
    keep_owner: bool = False,
) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8, surrogates kept, newlines untouched).

    ``mode``: the new file's permission bits; None keeps the old file's (0o644 for a new file).
    ``makedirs``: create the parent directories first. ``keep_owner``: give the new file the old file's owner and
    group (as root; a non-root writer that cannot keeps its own).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if makedirs:
        os.makedirs(directory, exist_ok=True)
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    if mode is None:
        mode = (old.st_mode & 0o7777) if old is not None else 0o644
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if keep_owner and old is not None and hasattr(os, "chown"):
            try:
                os.chown(tmp, old.st_uid, old.st_gid)
            except PermissionError:
                if os.geteuid() == 0:
                    raise
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def differs(path: Union[str, os.PathLike[str]], text: str) -> bool:
    """Whether the file at ``path`` does not hold exactly ``text`` (a file that cannot be read differs)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return handle.read() != text
    except OSError:
        return True
