"""`${VAR}` and `${VAR:-default}` in server entries, expanded the way Claude Code expands `.mcp.json`.

Claude Code's rule (services/mcp/envExpansion.ts), kept exactly:

* a reference is `${...}` up to the first `}`; `$VAR` without braces is left as it is;
* `${VAR}` is VAR's value, `${VAR:-default}` is VAR's value or, when VAR is not set, `default`. A
  variable set to the empty string is set: it expands to nothing, not to the default. The default
  ends at the next `:-` (`${A:-x:-y}` is `x` when A is unset: Claude Code splits the reference in at
  most two parts and drops the rest);
* one pass: a value or a default that contains `${...}` is not expanded again;
* an unset variable without a default is an error (Claude Code refuses the server); breakwater
  names the file, the entry, the key and the variable.

Expanded in `command`, `args`, `env`, `url` and `headers` (and `envFile`, which VS Code and Cursor
expand); never in `headersHelper`, which runs in a shell that expands its own `$VAR`.

Two other clients' forms are understood so their files work unchanged: Cursor's and VS Code's
`${env:VAR}` (the same as `${VAR}`), `${userHome}`, `${workspaceFolder}`,
`${workspaceFolderBasename}`, `${pathSeparator}` and `${/}`. VS Code's `${input:ID}`,
`${command:ID}` and `${config:KEY}` are answered by the editor when it starts a server; a
background gateway has no one to ask, so they are a config error that says what to write instead.

Gemini CLI reads `$VAR` without braces as a variable too, in its own settings files; those are read
with `bare=True` (an unset one is an error, as `${VAR}` is). Codex expands nothing in its
`config.toml` (it names variables in keys of their own): read with `literal=True`.

OpenCode's files are read with `opencode=True`: `{env:VAR}` is VAR's value and `{file:PATH}` the
content of a file (`~` is the home folder, a relative path is the config file's folder's), both
secrets wherever they land.

Values from the environment that land in `env` or `headers`, and values of any variable whose name
looks like a credential (`API_KEY`, `GITHUB_TOKEN`), are secrets (`config/_redact.py`). May import
the core leaves and `config/_redact.py` only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from breakwater._paths import MAX_SECRET_FILE_BYTES, read_user_file
from breakwater.config._redact import is_credential_name
from breakwater.errors import ConfigError
from breakwater.status import OFF_FOR_VALUES

__all__ = ["EDITOR_ONLY", "OFF_FOR_VALUES", "Expander", "has_reference", "unset_off"]

_REFERENCE = re.compile(r"\$\{([^}]+)\}")
#: A shell's default without the colon (`${VAR-x}`, `${VAR=x}`), which Claude Code's rule reads as one odd name.
_SHELL_DEFAULT = re.compile(r"([A-Za-z_]\w*)[-=](.*)", re.DOTALL)
_OPENCODE = re.compile(r"\{(env|file):([^}]*)\}")
_BARE_OR_BRACED = re.compile(r"\$(?:\{([^}]+)\}|([A-Za-z_]\w*))")
#: The prefixes of VS Code's references that the editor answers as it starts a server (`${input:ID}` and the like).
EDITOR_ONLY = ("input:", "command:", "config:")


#: VS Code's variables of the editor's state: the fix "set file in the environment" named no variable a shell can set.
_EDITOR_STATE = frozenset(
    {"file", "fileBasename", "fileBasenameNoExtension", "fileDirname", "fileDirnameBasename", "fileExtname"}
    | {"fileWorkspaceFolder", "fileWorkspaceFolderBasename", "relativeFile", "relativeFileDirname", "lineNumber"}
    | {"columnNumber", "selectedText", "execPath", "defaultBuildTask", "cwd"}
)


def _editor_state(name: str) -> bool:
    """A VS Code variable of the editor's state, or of one folder of a multi-root workspace (`workspaceFolder:api`)."""
    return name in _EDITOR_STATE or name.startswith(("workspaceFolder:", "workspaceFolderBasename:"))


def unset_off(fields: dict[str, Any], expand: Expander, where: str) -> dict[str, Any]:
    """An entry's fields, turned off (`enabled` false, with the reasons) when a value it names cannot be had here: a
    variable not set, an editor's `${input:...}` (`Expander.disable_unset`); as they were otherwise."""
    reasons = list(dict.fromkeys(expand.unset.pop(where, ())))
    if not reasons:
        return fields
    said = OFF_FOR_VALUES + "; ".join(reasons)
    return fields | {"enabled": False, "disabled_by": said, "notes": (*fields.get("notes", ()), f"not started: {said}")}


#: How `unset_off`'s reason (`disabled_by`) begins: a server off for it is not turned on by `enabled = true`, and the
#: commands that run servers warn of it.


def has_reference(value: str) -> bool:
    """Whether `value` holds a `${...}` reference (kept literally when expansion is lenient)."""
    return _REFERENCE.search(value) is not None


def _workspace(config_path: str) -> Path:
    # VS Code's .vscode/mcp.json and Cursor's .cursor/mcp.json belong to the folder above them.
    folder = Path(config_path).resolve().parent if config_path else Path.cwd()
    return folder.parent if folder.name in (".vscode", ".cursor") else folder


@dataclass
class Expander:
    """Expands references in one config file's entries, against one environment.

    `strict=False` (for `config import`, which must not need the variables) keeps an unset
    variable's reference literally and records it in `missing`, as `(key, variable)`.
    """

    environ: Mapping[str, str]
    path: str
    strict: bool = True
    #: `$VAR` without braces is a reference too (Gemini CLI's own files).
    bare: bool = False
    #: Nothing is expanded (Codex's config.toml).
    literal: bool = False
    #: OpenCode's `{env:VAR}` and `{file:PATH}` (its files only).
    opencode: bool = False
    #: Unset variables without a default met while lenient: (key, variable name).
    missing: list[tuple[str, str]] = field(default_factory=list)
    #: An unset variable turns its server off instead of refusing the file (`serve`, `status`: one server's missing
    #: variable must not cost every other server, as it does not in the agents that read these files).
    disable_unset: bool = False
    #: Why values met with `disable_unset` cannot be had, by entry (`where` -> reasons): `unset_off` turns each off.
    unset: dict[str, list[str]] = field(default_factory=dict)
    #: Expanded values that are secrets, per entry (`where` -> values); read by `take_secrets`.
    _secrets: dict[str, list[str]] = field(default_factory=dict)

    def take_secrets(self, where: str) -> tuple[str, ...]:
        """The secret values expanded into the entry `where` (each entry's values once)."""
        return tuple(dict.fromkeys(self._secrets.pop(where, [])))

    def __call__(self, value: str, *, where: str, key: str, secret: bool = False) -> str:
        """`value` with its references expanded; `key` (under entry `where`) names it in errors."""
        if self.literal:
            return value
        if self.opencode and "{" in value:
            value = _OPENCODE.sub(lambda m: self._opencode(m.group(0), m.group(1), m.group(2), where=where, key=key), value)
        if "${" not in value and not (self.bare and "$" in value):
            return value

        def one(match: re.Match[str]) -> str:
            content = match.group(1)
            if content is None:  # $NAME
                return self._one(match.group(0), match.group(2), where=where, key=key, secret=secret)
            return self._one(match.group(0), content, where=where, key=key, secret=secret)

        return (_BARE_OR_BRACED if self.bare else _REFERENCE).sub(one, value)

    def _one(self, whole: str, content: str, *, where: str, key: str, secret: bool) -> str:
        parts = content.split(":-")
        name, default = parts[0], (parts[1] if len(parts) > 1 else None)
        if name.startswith(EDITOR_ONLY) or (_editor_state(name) and name not in self.environ):
            error = self._editor_only(name, key)
            if not self.strict:  # `config import`: carried over as written, and named (`import_notes`)
                self.missing.append((key, name))
                return whole
            if self.disable_unset:  # one entry's prompt for the editor is that server's problem, not every other's
                self.off(where, f"{error.detail} ({error.fix})")
                return whole
            raise error
        lookup = name.removeprefix("env:")
        if not lookup.strip():
            raise self._no_name(whole, key)
        value = self.environ.get(lookup)
        if value is None:
            value = self._predefined(lookup)
            if value is not None:
                return value
        else:
            if secret or is_credential_name(lookup):
                self._secrets.setdefault(where, []).append(value)
            return value
        if default is not None:
            return default
        if not self.strict:
            self.missing.append((key, lookup))
            return whole
        if self.disable_unset:
            self.off(where, f"{lookup} is not set (set it in the environment breakwater runs in, or write ${{{lookup}:-value}})")
            return whole
        said = whole if whole.startswith("${") else f"{whole} (Gemini CLI's form of ${{{lookup}}})"
        fix = f"set {lookup} in the environment breakwater runs in, or give a default: ${{{lookup}:-value}}"
        if (shell := _SHELL_DEFAULT.fullmatch(lookup)) is not None:  # `${VAR-x}` and `${VAR=x}`: the shell's, not ours
            fix = f"a default follows `:-` here: write ${{{shell.group(1)}:-{shell.group(2)}}}"
        raise ConfigError(f"the variable {lookup} is not set and {said} has no default", path=self.path, key=key, fix=fix)

    def _opencode(self, whole: str, kind: str, name: str, *, where: str, key: str) -> str:
        if kind == "file":
            file = Path(os.path.expanduser(name))
            if not file.is_absolute():
                file = (Path(self.path).parent if self.path else Path.cwd()) / file
            try:
                value = read_user_file(file, MAX_SECRET_FILE_BYTES).decode("utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or str(exc)
                said = f"{whole}: cannot read {str(file)!r}: {reason}"
                raise ConfigError(said, path=self.path, key=key, fix="fix the path") from None
            self._secrets.setdefault(where, []).append(value)
            return value
        if not name.strip():
            raise self._no_name(whole, key)
        found = self.variable(name, where=where, key=key, said=f" ({whole})")
        return whole if found is None else found

    def _no_name(self, whole: str, key: str) -> ConfigError:
        example = "{env:NAME}" if whole.startswith("{") else "${NAME}"
        return ConfigError(
            f"{whole} names no variable", path=self.path, key=key, fix=f"write {example}, with the variable's name"
        )

    def off(self, where: str, reason: str) -> None:
        """Turn the entry `where` off (while serving: `disable_unset`) for `reason`, instead of refusing the file."""
        self.unset.setdefault(where, []).append(reason)

    def variable(self, name: str, *, where: str, key: str, said: str = "") -> str | None:
        """The value of the environment variable `name`, a secret of the entry `where` (OpenCode's `{env:NAME}`,
        Codex's keys that name a variable); unset is an error, or None while lenient (recorded in `missing`)."""
        value = self.environ.get(name)
        if value is None:
            if not self.strict:
                self.missing.append((key, name))
                return None
            if self.disable_unset:
                self.off(where, f"{name} is not set (set it in the environment breakwater runs in)")
                return None
            fix = f"set {name} in the environment breakwater runs in"
            raise ConfigError(f"the variable {name} is not set{said}", path=self.path, key=key, fix=fix)
        self._secrets.setdefault(where, []).append(value)
        return value

    def _predefined(self, name: str) -> str | None:
        if name == "userHome":
            return str(Path.home())
        if name == "workspaceFolder":
            return str(_workspace(self.path))
        if name == "workspaceFolderBasename":
            return _workspace(self.path).name
        if name in ("pathSeparator", "/"):
            return os.sep
        return None

    def _editor_only(self, name: str, key: str) -> ConfigError:
        kind, _, ident = name.partition(":")
        what = {
            "input": "VS Code asks you for this value when it starts the server",
            "command": "VS Code runs an editor command for this value",
            "config": "VS Code reads this value from its settings",
        }.get(kind, "VS Code fills this in from the editor (the open file, a folder of the workspace)")
        ident = ident or name
        var = re.sub(r"\W", "_", ident).upper() or "VALUE"
        return ConfigError(
            f"${{{name}}}: {what}; breakwater runs in the background with no editor to ask",
            path=self.path,
            key=key,
            fix=f"put the value in an environment variable and write ${{{var}}} (or ${{env:{var}}}), or write the value itself",
        )
