"""Why a store cannot be used, in one line that names the path and the fix."""
from __future__ import annotations

import os
from pathlib import Path


class StoreError(RuntimeError):
    """The store cannot be opened or written; the message names the path and the fix."""


def explain(path: Path, exc: BaseException) -> str:
    """One line for a failed open or write of the store at `path`."""
    msg = str(exc)
    folder = path.parent if path.parent.exists() else None
    if folder is not None and not os.access(folder, os.W_OK) or (
            path.exists() and not os.access(path, os.W_OK)):
        msg = "read-only"
    if "disk is full" in msg or getattr(exc, "errno", None) == 28:
        return (f"the disk holding the store {path} is full: free some space, or pass --db "
                "with a path on another disk")
    if "file is not a database" in msg:
        return (f"{path} is not a Starvation Monitor store (not an SQLite file): pass --db "
                "with a new file name or an existing store")
    if ("readonly" in msg or "read-only" in msg) and not path.exists():
        return (f"cannot create the store {path}: its folder is read-only: pass --db with a "
                "path in a folder you can write")
    if "readonly" in msg or "read-only" in msg:
        return (f"the store {path} is read-only: pass --db with a path you can write, or "
                "fix its permissions")
    if "unable to open" in msg or isinstance(exc, OSError):
        return (f"cannot open or create the store {path} ({msg}): pass --db with a path in "
                "a folder you can write")
    return f"cannot use the store {path}: {msg}"
