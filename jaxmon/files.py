"""Files jaxmon writes for others to read: replaced atomically, so a reader never sees a partial one."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_atomically(path: Path, payload: Mapping[str, Any]) -> None:
    """Replace `path` with `payload` as JSON so that no reader ever sees a partial file."""
    data = json.dumps(payload, separators=(",", ":")).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def tar_gz(directory: Path) -> bytes:
    """`directory`'s files as a gzip tar, paths relative to it (`plugins/profile/<run>/<host>.xplane.pb`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(directory)))
    return buf.getvalue()
