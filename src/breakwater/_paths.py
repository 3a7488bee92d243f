"""Where breakwater keeps files: the one place that knows each platform's user directories.

The directories come from `platformdirs`, so a user's `XDG_*` variables win on Linux:

- data (journal, task ids, operation store): Linux `$XDG_DATA_HOME/breakwater` (`~/.local/share`),
  macOS `~/Library/Application Support/breakwater`, Windows `%LOCALAPPDATA%\\breakwater`;
- cache (last-known tool lists): Linux `$XDG_CACHE_HOME/breakwater` (`~/.cache`), macOS
  `~/Library/Caches/breakwater`, Windows `%LOCALAPPDATA%\\breakwater\\Cache`;
- runtime (admission lock files): Linux `$XDG_RUNTIME_DIR/breakwater`, else the cache; macOS
  `~/Library/Caches/TemporaryItems/breakwater`; Windows `%LOCALAPPDATA%\\Temp\\breakwater`.

Data outlives caches; the cache holds what can be rebuilt; the runtime directory holds what lives only
while the user is logged in. One more that is not breakwater's: where Claude Code's managed settings live
(`claude_managed_settings`), the machine's MCP policy that `config._claude_policy` applies.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
import sys
import warnings
from pathlib import Path

import platformdirs

__all__ = [
    "MAX_SECRET_FILE_BYTES",
    "MAX_USER_FILE_BYTES",
    "cache_dir",
    "claude_managed_settings",
    "config_dir",
    "data_dir",
    "file_stem",
    "read_user_file",
    "runtime_dir",
    "runtime_dirs_elsewhere",
    "say_unusable",
    "write_atomic",
]

APP = "breakwater"


def claude_managed_settings() -> tuple[Path, ...]:
    """Where Claude Code's managed settings (an administrator's) live on this platform."""
    if sys.platform == "darwin":
        return (Path("/Library/Application Support/ClaudeCode/managed-settings.json"),)
    if sys.platform == "win32":
        return (
            Path(r"C:\Program Files\ClaudeCode\managed-settings.json"),
            Path(r"C:\ProgramData\ClaudeCode\managed-settings.json"),
        )
    return (Path("/etc/claude-code/managed-settings.json"),)


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


#: Where systemd keeps each user's runtime directory (`$XDG_RUNTIME_DIR` is `/run/user/UID` there).
RUN_USER = Path("/run/user")


def runtime_dir() -> Path:
    """The user's runtime directory for breakwater.

    On Linux without `$XDG_RUNTIME_DIR`, the user's `/run/user/UID` when it is there (the variable's value on a systemd
    machine), else the cache directory, as good for lock files (containers and CI runners often lack the first). The
    place must not depend on the variable: clients start `serve` with some of the environment dropped (the MCP
    Inspector), and a session without it looked for the shared gateway in the cache, started a second one, and
    `gateway list` from the terminal found none of them.
    """
    if sys.platform.startswith("linux") and not os.environ.get("XDG_RUNTIME_DIR"):
        own = RUN_USER / str(os.getuid())
        try:
            usable = own.is_dir() and own.stat().st_uid == os.getuid() and own.stat().st_mode & 0o077 == 0
        except OSError:
            usable = False
        if not usable:
            return cache_dir()
        (own / APP).mkdir(mode=0o700, exist_ok=True)
        return own / APP
    # Created by platformdirs when missing, 0700 as the XDG spec wants: made 0755 on the way to a directory below it,
    # it failed platformdirs' check at every later look, which then answered another directory (sessions and
    # `gateway list` lost the gateway). One that fails the check (another mode, a file) is replaced by the same
    # fallback at every look; platformdirs' warning about it, a Python warning with its source line, is not shown.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", getattr(platformdirs, "RuntimeDirWarning", UserWarning))
        return Path(platformdirs.user_runtime_dir(APP, appauthor=False, ensure_exists=True))


def runtime_dirs_elsewhere() -> list[Path]:
    """The runtime directories a process of this user started with another environment uses, those that exist.

    Clients drop variables or keep them as they please (the SDKs' default environment keeps `HOME` and
    few more): a gateway an agent started without `XDG_RUNTIME_DIR` (and `XDG_CACHE_HOME`) keeps its
    socket in `~/.cache/breakwater`, and `gateway list` from the user's shell, with them set, looked
    only in its own. Linux only: elsewhere the directories do not come from the environment.
    """
    if not sys.platform.startswith("linux"):
        return []
    here = runtime_dir()
    # Without the variables: the user's /run/user/UID, else the default cache; with XDG_CACHE_HOME: that cache.
    candidates = (RUN_USER / str(os.getuid()) / APP, Path.home() / ".cache" / APP, cache_dir())
    found: list[Path] = []
    for candidate in candidates:
        if candidate != here and candidate not in found and candidate.is_dir():
            found.append(candidate)
    return found


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


#: The most breakwater reads of a file the user names (a config, its `servers_file` or `envFile`). Most are kilobytes,
#: but Claude Code's `~/.claude.json` keeps every project's history and reaches 15-100 MB (anthropics/claude-code
#: #6394, #10192); 4 MiB refused real ones. The bound is for files that are no config at all.
MAX_USER_FILE_BYTES = 256 * 1024 * 1024
#: The most read of a file whose whole text is one secret (OpenCode's `{file:}`, a private key): a token or a PEM key
#: is a few kilobytes, and every secret is matched in everything breakwater prints (`config/_redact.py`).
MAX_SECRET_FILE_BYTES = 64 * 1024


def read_user_file(path: Path, limit: int = MAX_USER_FILE_BYTES) -> bytes:
    """The bytes of the regular file `path`; an OSError whose `strerror` says why for anything else.

    Checked before it is opened: opening a FIFO waits for a writer, and a device (`/dev/zero`) never ends.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "not a regular file (a directory, a FIFO or a device)")
    with open(path, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        size = f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit // 1024} KiB"
        raise OSError(errno.EFBIG, f"larger than {size}, far more than any such file")
    return data


#: The longest `file_stem`: with a fingerprint and a suffix beside it, far below the 255 bytes a file name may have.
_STEM_MAX = 100
_NOT_IN_FILE_NAMES = re.compile(r"[^A-Za-z0-9_.\-]")


def file_stem(name: str) -> str:
    """`name` (a server's) as the start of a file name, one per name: other characters made `_`, and a long one cut.

    A name that was changed on the way, or that holds a capital (which a case-insensitive file system would not
    tell apart), gets a hash of the whole name after it: "a b" and "a_b", "é" and "ü", "Git" and "git" shared one
    cache file, and a 300-character name made the file name too long to open.
    """
    safe = _NOT_IN_FILE_NAMES.sub("_", name)
    if safe == name and name == name.lower() and len(name) <= _STEM_MAX:
        return name
    return f"{safe[: _STEM_MAX - 17]}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


#: The directories `say_unusable` has spoken of in this process.
_SAID_UNUSABLE: set[str] = set()


def say_unusable(logger: logging.Logger, what: str, directory: Path, exc: OSError, setting: str, costs: str) -> None:
    """Say once per process and directory that a directory breakwater keeps `what` in cannot be written, what that
    costs, and that `setting` (the knob, and the value it should take) is the fix.

    Such a directory is an optimisation: breakwater goes on without it, but a user who named a file there, or runs
    with a read-only home, lost the feature without a word."""
    key = f"{what}\0{directory}"
    if key in _SAID_UNUSABLE:
        return
    _SAID_UNUSABLE.add(key)
    reason = exc.strerror or str(exc)
    if isinstance(exc, (FileExistsError, NotADirectoryError)) or directory.is_file():
        reason = "a file is where a directory should be"
    logger.warning("breakwater: cannot keep %s in %s (%s): %s (fix: set %s)", what, directory, reason, costs, setting)
