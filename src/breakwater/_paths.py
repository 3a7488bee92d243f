"""Where breakwater keeps files: the one place that knows each platform's user directories.

The directories come from `platformdirs`, so a user's `XDG_*` variables win on Linux:

- data (journal, task ids, operation store): Linux `$XDG_DATA_HOME/breakwater` (`~/.local/share`),
  macOS `~/Library/Application Support/breakwater`, Windows `%LOCALAPPDATA%\\breakwater`;
- cache (last-known tool lists): Linux `$XDG_CACHE_HOME/breakwater` (`~/.cache`), macOS
  `~/Library/Caches/breakwater`, Windows `%LOCALAPPDATA%\\breakwater\\Cache`;
- runtime (admission lock files): Linux `$XDG_RUNTIME_DIR/breakwater`, else the cache; macOS
  `~/Library/Caches/TemporaryItems/breakwater`; Windows `%LOCALAPPDATA%\\Temp\\breakwater`.

Data outlives caches; the cache holds what can be rebuilt; the runtime directory holds what lives only
while the user is logged in.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs

__all__ = ["cache_dir", "config_dir", "data_dir", "runtime_dir", "write_atomic"]

APP = "breakwater"


def data_dir() -> Path:
    """The user's data directory for breakwater (see the module docstring)."""
    return Path(platformdirs.user_data_dir(APP, appauthor=False))


def config_dir() -> Path:
    """The user's config directory for breakwater (OAuth tokens): Linux `$XDG_CONFIG_HOME/breakwater`
    (`~/.config`), macOS `~/Library/Application Support/breakwater`, Windows `%LOCALAPPDATA%\\breakwater`."""
    return Path(platformdirs.user_config_dir(APP, appauthor=False))


def cache_dir() -> Path:
    """The user's cache directory for breakwater."""
    return Path(platformdirs.user_cache_dir(APP, appauthor=False))


def runtime_dir() -> Path:
    """The user's runtime directory for breakwater.

    On Linux only when `$XDG_RUNTIME_DIR` is set: without it platformdirs guesses `/run/user/UID`,
    which containers and CI runners often lack, and the cache directory is as good for lock files.
    """
    if sys.platform.startswith("linux") and not os.environ.get("XDG_RUNTIME_DIR"):
        return cache_dir()
    return Path(platformdirs.user_runtime_dir(APP, appauthor=False))


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a reader sees the old file or the new one, never half of one."""
    # Written beside it under a name of this process's own (two processes may write one cache file at
    # once) and renamed over it: a rename is atomic.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
