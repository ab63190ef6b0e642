"""Writing outputs so that nothing is ever half-written or lost: a temporary beside, then a rename.

A file or directory is first written under a hidden temporary name in the same
folder (so the rename stays on one filesystem and is atomic), then renamed into
place. A reader, a crash or a Ctrl-C sees the old version or the new one, never a
mix; a failed write leaves the old one untouched and removes its temporary.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Replace ``path`` with ``data`` (text is written as UTF-8) in one rename."""
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on failure it is removed."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; on success it replaces ``path``.

    A directory cannot be renamed over a non-empty one, so the old ``path`` is first
    renamed aside and removed only once the new one is in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}-", suffix=".old", dir=path.parent))
            os.rename(path, old / path.name)  # aside, inside a fresh folder: the name is free
        try:
            os.rename(tmp, path)
        except OSError:
            if old is not None:
                os.rename(old / path.name, path)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_empty_dir(path: Path) -> bool:
    return path.is_dir() and next(path.iterdir(), None) is None
