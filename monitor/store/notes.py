"""Failure reasons that could not be written into the store (its disk full, its file gone),
kept beside it in `<store>-notes` for the next start-up, which closes the run with them
instead of "the process is gone".

The file is made at a fixed size when the store opens (SIZE bytes of spaces), and a note is
written over those bytes in place: a full disk still takes it, since no block is added.
Standard library only."""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

SIZE = 8192


class Notes:
    """`<store>-notes`: {run id: reason}, as JSON padded with spaces to SIZE bytes."""

    def __init__(self, db_path: Path) -> None:
        self.path = Path(f"{db_path}-notes")

    def reserve(self) -> None:
        """Make the file at its full size, if it is not there (best effort)."""
        if self.path.exists():
            return
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, b" " * SIZE)
            finally:
                os.close(fd)

    def read(self) -> dict[int, str]:
        try:
            text = self.path.read_bytes().decode(errors="replace").strip()
            return {int(k): str(v) for k, v in json.loads(text).items()} if text else {}
        except (OSError, ValueError, AttributeError):
            return {}

    def _write(self, notes: dict[int, str]) -> bool:
        data = json.dumps({str(k): v for k, v in notes.items()}).encode()
        while len(data) > SIZE and notes:  # the oldest go first
            notes.pop(min(notes))
            data = json.dumps({str(k): v for k, v in notes.items()}).encode()
        try:
            with open(self.path, "r+b") as f:  # in place: the blocks are already there
                f.write(data + b" " * (SIZE - len(data)))
            return True
        except OSError:
            return False

    def add(self, run_id: int, reason: str) -> bool:
        """Keep a run's failure reason; False when even this could not be written."""
        notes = self.read()
        notes[int(run_id)] = reason[:1000]
        return self._write(notes)

    def take(self, run_ids: list[int]) -> dict[int, str]:
        """The notes of these runs, removed from the file."""
        notes = self.read()
        mine = {r: notes.pop(r) for r in run_ids if r in notes}
        if mine:
            self._write(notes)
        return mine
