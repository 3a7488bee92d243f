"""Files the test server shares with tests: the state file, the side-effect ledger, the control file.

The formats are described in `breakwater.testing.server`'s docstring. Imports nothing of breakwater.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

__all__ = ["ControlFile", "append_ledger", "count_ledger", "read_ledger", "read_state", "write_atomic"]


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a reader sees the old file or the new one, never half of one.

    `breakwater._paths.write_atomic` for the test server, which imports nothing of breakwater."""
    # Written beside it and renamed over it: a rename is atomic.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a `--state-file` written by a testserver process."""
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def read_ledger(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All side-effect records of a `--ledger` file, oldest first ([] when it does not exist yet)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def count_ledger(path: str | os.PathLike[str], *, tool: str | None = None, operation_id: str | None = None) -> int:
    """How many side effects the ledger holds, optionally only for one tool and/or operation id."""
    return sum(
        1
        for rec in read_ledger(path)
        if (tool is None or rec.get("tool") == tool) and (operation_id is None or rec.get("operation_id") == operation_id)
    )


def append_ledger(path: Path, record: Mapping[str, Any]) -> None:
    """Append one record as a JSON line, whole even when several processes share the ledger."""
    line = json.dumps(record, sort_keys=True) + "\n"
    # Several server processes may share one ledger; the lock (a sibling file, so it works on
    # Windows too) keeps lines whole.
    with FileLock(f"{path}.lock"), path.open("a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


class ControlFile:
    """Run-time tool overrides, re-read only when the file's mtime or size changes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._overrides: dict[str, dict[str, str]] = {}

    def overrides(self) -> dict[str, dict[str, str]]:
        """Tool name (or "*") -> key -> raw value text; the last good overrides when the file is unreadable."""
        try:
            st = self._path.stat()
        except FileNotFoundError:
            self._stamp, self._overrides = None, {}
            return self._overrides
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._overrides = self._load()
            except (OSError, ValueError) as exc:
                # A benchmark rewriting the file must not crash the server; keep the last good overrides.
                print(f"testserver: ignoring control file {self._path}: {exc}", file=sys.stderr)
        return self._overrides

    def _load(self) -> dict[str, dict[str, str]]:
        data = json.loads(self._path.read_text(encoding="utf-8") or "{}")
        tools = data.get("tools", {}) if isinstance(data, dict) else None
        if not isinstance(tools, dict):
            raise ValueError('expected {"tools": {NAME: {KEY: VALUE}}}')
        out: dict[str, dict[str, str]] = {}
        for name, keys in tools.items():
            if not isinstance(keys, dict):
                raise ValueError(f"tools.{name} must be an object")
            out[str(name)] = {str(k): _json_value_text(v) for k, v in keys.items()}
        return out


def _json_value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)
