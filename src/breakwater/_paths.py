"""Where breakwater keeps files: the one place that knows each platform's user directories.

Data (the journal, task ids, the operation store) outlives caches; the cache holds what can be rebuilt
(last-known tool lists); the runtime directory holds what lives only while the user is logged in
(the admission lock files). A user's `XDG_*` variables win on Linux.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["cache_dir", "data_dir", "runtime_dir"]

APP = "breakwater"


def data_dir() -> Path:
    """Linux `$XDG_DATA_HOME/breakwater` (`~/.local/share`), macOS `~/Library/Application Support/breakwater`,
    Windows `%LOCALAPPDATA%\\breakwater`."""
    home = Path.home()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / APP
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / APP
    return Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share") / APP


def cache_dir() -> Path:
    """Linux `$XDG_CACHE_HOME/breakwater` (`~/.cache`), macOS `~/Library/Caches/breakwater`,
    Windows `%LOCALAPPDATA%\\breakwater\\Cache`."""
    home = Path.home()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / APP / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / APP
    return Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / APP


def runtime_dir() -> Path:
    """`$XDG_RUNTIME_DIR/breakwater` where the platform has one, else the cache directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / APP if runtime and sys.platform != "win32" else cache_dir()
