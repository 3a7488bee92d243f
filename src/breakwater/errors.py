"""The one exception hierarchy.

BreakwaterError
├── ConfigError            a config file is broken: names the file, the key and the fix (exit code 2)
└── CallError              a tool call failed; each leaf maps one-to-one to an error code the model sees
    └── …                  (see `CallError.code`)
"""

from __future__ import annotations

__all__ = ["BreakwaterError", "ConfigError"]


class BreakwaterError(Exception):
    """Base of every error breakwater raises on purpose."""


class ConfigError(BreakwaterError):
    """A configuration that cannot be used, with where and how to fix it."""

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None, fix: str | None = None):
        self.path = path
        self.key = key
        self.fix = fix
        self.detail = message
        where = ": ".join(p for p in (path, key) if p)
        text = f"{where}: {message}" if where else message
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)
