"""`breakwater config import`: move an agent's mcpServers behind breakwater in one step.

Given the file an agent reads today (Claude Code's `.mcp.json`, Cursor's `mcp.json`, Claude
Desktop's config, VS Code's `mcp.json`, Gemini CLI's `settings.json`, Codex's `config.toml`), it
writes, beside it:

* `breakwater.servers.json` — the servers, exactly as they were (`breakwater.servers.toml` for
  Codex's, `_import_codex.py`; Gemini CLI's `mcp.allowed` and `mcp.excluded` go with them);
* `breakwater.toml` — breakwater's config, pointing at that file, with the policy knobs to tune;
* the one-entry file the agent should use instead, which launches `breakwater serve`.

With `--replace`, the original is kept as `<name>.bak` and replaced by the one-entry file. Nothing
existing is overwritten without `--force`.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import stat
import sys
from functools import partial
from pathlib import Path
from typing import Any

from breakwater.config import Config, _jsonc
from breakwater.config._checks import DEFAULT_TOOL_NAME_MAX, namespaced_pattern
from breakwater.config._claude import claude_unstarted_servers
from breakwater.config._dialect import (
    NUMBERS_NOTE,
    SIGN_IN_KEYS,
    claude_disabled_servers,
    claude_local_servers,
    skipped_entry,
)
from breakwater.config._expand import EDITOR_ONLY
from breakwater.config._files import load_config_lenient
from breakwater.config._import_codex import SERVERS_TOML, Named, codex_files, name_taken
from breakwater.config._shapes import gateway_entry, opencode_entry, opencode_tool_patterns, server_table
from breakwater.errors import ConfigError

__all__ = ["import_main", "import_notes", "plan_import"]

SERVERS_FILE = "breakwater.servers.json"
TOML_FILE = "breakwater.toml"
GATEWAY_NAME = "breakwater"
#: What Claude Code puts before each tool name of the entry written for the agent (`mcp__SERVER__`).
AGENT_PREFIX = f"mcp__{GATEWAY_NAME}__"
#: The longest tool name the written breakwater.toml lets the gateway list: with Claude Code's prefix, the 64 a model
#: API takes.
NAME_MAX = DEFAULT_TOOL_NAME_MAX - len(AGENT_PREFIX)

TOML_TEMPLATE = """\
# breakwater's config, written by `breakwater config import` from {source}.
# The servers themselves are in {servers}, unchanged. Every knob: `breakwater config knobs`.
servers_file = "{servers}"

[call]
timeout_s = 5          # one attempt of a tool call; slow tools get their own below

# [servers.NAME.tools.TOOL]
# timeout_s = 60
# retry = "idempotent" # safe | idempotent | never (default: from the tool's annotations)

[gateway]
# Agents prefix each tool's name (Claude Code: {agent_prefix}NAME); model APIs take {api_max} characters at most.
tool_name_max = {name_max}
"""


def _breakwater_command() -> list[str]:
    # An absolute path: agents often launch servers with a minimal PATH.
    found = shutil.which("breakwater")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-m", "breakwater"]


def import_notes(config: Config, missing: list[tuple[str, str]]) -> list[str]:
    """What the user must still do: sign in to OAuth servers, set the variables this shell lacks."""
    notes = []
    for spec in config.servers:
        if spec.oauth is not None or any(note.startswith(tuple(SIGN_IN_KEYS)) for note in spec.notes):
            notes.append(f"{spec.name} signs in with OAuth: run `breakwater auth login {spec.name}` once")
    for variable in sorted({var for _, var in missing}):
        named = [key for key, var in missing if var == variable]
        if variable.startswith(EDITOR_ONLY):
            notes.append(
                f"${{{variable}}} ({', '.join(named)}) is VS Code's to ask as it starts the server; breakwater has no "
                "editor to ask, so that server stays off (the others run) until the value is in an environment "
                "variable written there as ${NAME}"
            )
            continue
        # Codex's keys name a variable (`bearer_token_env_var = "X"`): there is no `${X:-default}` to write there.
        named_only = all(any(f".{k}" in key for k in _NAMING_KEYS) for key in named)
        default = "" if named_only else f", or give a default: ${{{variable}:-value}}"
        notes.append(
            f"{variable} is not set here ({', '.join(named)}): breakwater expands it when it starts and leaves each "
            f"server that needs it off until it is set (the others run), so set it where your agent runs{default}"
        )
    return notes


#: Codex's keys whose value is the name of a variable (no `${...}` is written there, so no default either).
_NAMING_KEYS = ("bearer_token_env_var", "env_http_headers", "env_vars")


def plan_import(source: Path) -> dict[Path, str]:
    """The files to write (path -> content) for `source`; validates the source first."""
    return _plan(source)[0]


def _plan(source: Path) -> tuple[dict[Path, str], list[str]]:
    # A broken file is reported here, with file, key and fix. Variables are checked, not expanded:
    # the servers file keeps every ${VAR} (and every oauth object) exactly as written.
    config, missing = load_config_lenient(source)
    folder = source.parent
    toml_path = (folder / TOML_FILE).resolve()
    command = [*_breakwater_command(), "serve", "--config", str(toml_path)]
    # A tool's name through the gateway written here (agents' approvals and patterns must follow it).
    named = partial(namespaced_pattern, config.gateway.tool_name_template, limit=NAME_MAX)
    more: list[str] = []
    if source.suffix == ".toml":  # Codex's config.toml (load_config refused any other TOML file)
        servers_text, agent_text, kept = codex_files(source, config, command, GATEWAY_NAME, named)
        servers_name = SERVERS_TOML
    else:
        servers_text, agent_text, kept, more = _json_files(source, command, named)
        servers_name = SERVERS_FILE
    files = {
        folder / servers_name: servers_text,
        folder / TOML_FILE: TOML_TEMPLATE.format(
            source=source.name,
            servers=servers_name,
            agent_prefix=AGENT_PREFIX,
            api_max=DEFAULT_TOOL_NAME_MAX,
            name_max=NAME_MAX,
        ),
        source: agent_text,
    }
    if not config.servers:
        # A gateway in front of nothing would replace the agent's file with one that serves no tool.
        raise ConfigError("the file lists no server breakwater can start", path=str(source), fix="add the servers first")
    left = [f"{name} stays in the agent's file: {skipped_entry(entry, opencode=True)}" for name, entry in kept.items()]
    # The file's other keys stay with the agent, so config.notes (about breakwater reading them) do not apply.
    return files, [*import_notes(config, missing), *left, *more, *_entry_notes(config)]


def _json_files(source: Path, command: list[str], named: Named) -> tuple[str, str, dict[str, Any], list[str]]:
    """(the servers file's text, the agent's new file, the entries that stay with the agent, notes) for a JSON file."""
    text = source.read_text(encoding="utf-8-sig")
    raw: dict[str, Any] = json.loads(stripped := _jsonc.strip(text), parse_int=_jsonc.number, parse_float=_jsonc.number)
    top, entries = server_table(raw, str(source)) or ("mcpServers", {})
    if GATEWAY_NAME in entries:
        raise name_taken(source, f"{top}.{GATEWAY_NAME}")
    ours = gateway_entry(top, next(iter(entries.values()), None), command)
    # Entries breakwater cannot connect to (WebSocket, Claude Code's IDE links) stay with the agent.
    served = {name: _numbers_as_written(entry) for name, entry in entries.items() if not _skipped(entry)}
    kept = {name: entry for name, entry in entries.items() if _skipped(entry)}
    # Rejected in Claude Code, or not approved there: written off, so the gateway that replaces it does not start them
    # either (the servers file is no `.mcp.json`: Claude Code's answers are not read again there).
    unstarted = claude_unstarted_servers(source, served)
    for name in unstarted.keys() & served.keys():
        served[name] = {**served[name], "disabled": True}
    # Switched off in Claude Code's /mcp for this folder (~/.claude.json): off here too, where they would start again.
    # The servers file has no folders, so they are off for every folder's sessions; the note says so.
    switched_off = sorted(claude_disabled_servers(raw, Path.cwd(), str(source)).keys() & served.keys())
    for name in switched_off:
        served[name] = {**served[name], "disabled": True}
    agent_file = dict(raw)
    if top == "mcp.servers":  # VS Code's user settings.json, OpenCode's second config version
        agent_file["mcp"] = {**raw["mcp"], "servers": {GATEWAY_NAME: ours, **kept}}
        servers_file: dict[str, Any] = {"mcp": {"servers": served}}
    else:
        agent_file[top] = {GATEWAY_NAME: ours, **kept}
        servers_file = {top: served}
    mcp = raw.get("mcp")
    if isinstance(mcp, dict) and top not in ("mcp", "mcp.servers") and {"allowed", "excluded"} & mcp.keys():
        # Gemini CLI's lists of servers to start now name breakwater's servers: they go with them, and the agent,
        # which starts only breakwater, keeps the rest of its `mcp` settings.
        servers_file = {"mcp": {k: v for k, v in mcp.items() if k in ("allowed", "excluded")}, **servers_file}
        agent_file["mcp"] = {k: v for k, v in mcp.items() if k not in ("allowed", "excluded")}
    notes: list[str] = []
    if switched_off and (project := claude_local_servers(raw, Path.cwd())) is not None:
        notes.append(
            f'{", ".join(switched_off)} written with "disabled": true: projects[{json.dumps(project[0])}].disabledMcpServers'
            " lists them (switched off in Claude Code's /mcp for that folder); the servers file has no folders, so they"
            ' are off for every session through breakwater: remove "disabled" to serve them'
        )
    if pending := [name for name in served if unstarted.get(name, "").startswith("not approved")]:
        notes.append(
            f'{", ".join(pending)} written with "disabled": true: Claude Code has not approved them (the lines below say'
            ' how); once it has, remove "disabled" from breakwater.servers.json to serve them'
        )
    if stripped != text:  # Zed's and VS Code's files start with comments; JSON has none to write them in
        notes.append(
            f"{source.name}'s comments (and trailing commas) are not in the files written; "
            "with --replace the original, comments and all, is kept as .bak"
        )
    if top in ("mcp", "mcp.servers") and any(opencode_entry(e) for e in served.values()):
        rewritten = opencode_tool_patterns(agent_file, list(served), GATEWAY_NAME, named)
        notes += [f"OpenCode's tool pattern {change} (its tools are named through breakwater now)" for change in rewritten]
    if source.name in (".mcp.json", ".claude.json"):
        notes += _claude_permission_notes(source, list(served), named)
    off = claude_disabled_servers(raw, Path.cwd(), str(source))
    if (local := claude_local_servers(raw, Path.cwd())) is not None and (started := [n for n in local[1] if n not in off]):
        names = ", ".join(started)
        notes.append(
            f"{names} ({local[0]}: `claude mcp add`'s local scope) stay with Claude Code, which starts them beside breakwater;"
            " to serve them through breakwater too, add them to the servers file"
        )
    return json.dumps(servers_file, indent=2) + "\n", json.dumps(agent_file, indent=2) + "\n", kept, notes


#: The permission lists of Claude Code's settings files.
_PERMISSION_LISTS = ("allow", "deny", "ask")


def _claude_permission_notes(source: Path, servers: list[str], named: Named) -> list[str]:
    """Claude Code's permission rules that name a moved server's tools, and what each must become.

    A rule is `mcp__SERVER`, `mcp__SERVER__*` or `mcp__SERVER__TOOL`; behind breakwater the tool is
    `mcp__breakwater__SERVER__TOOL`, so a rule left as it was matches nothing: a denied tool would be asked for
    instead, an allowed one asked every time. The files are the user's settings and the project's, and are not
    changed here (they are not the file being imported); the note names each rule and its new form.
    """
    files = [source.parent / ".claude" / "settings.json", source.parent / ".claude" / "settings.local.json"]
    files.append(Path.home() / ".claude" / "settings.json")
    notes = []
    for file in dict.fromkeys(files):
        try:
            permissions = json.loads(file.read_text(encoding="utf-8")).get("permissions", {})
        except (OSError, ValueError, AttributeError):
            continue
        for kind in _PERMISSION_LISTS:
            rules = permissions.get(kind) if isinstance(permissions, dict) else None
            for rule in rules if isinstance(rules, list) else ():
                if isinstance(rule, str) and (new := _through_breakwater(rule, servers, named)) is not None:
                    notes.append(f"{file}: permissions.{kind} {rule!r} must become {new!r} (the tool's name through breakwater)")
    return notes


def _through_breakwater(rule: str, servers: list[str], named: Named) -> str | None:
    for server in sorted(servers, key=len, reverse=True):
        head = f"mcp__{server}"
        if rule == head:
            return AGENT_PREFIX + named(server, "*")
        if rule.startswith(head + "__"):
            return AGENT_PREFIX + named(server, rule[len(head) + 2 :])
    return None


def _numbers_as_written(entry: Any) -> Any:
    """`entry` with each number where a string goes (`env`, OpenCode's `environment`, `headers`, `args`, Zed's older
    `command` object) as the text breakwater passes for it, the file's own (`_jsonc.number`). Written back as a JSON
    number, `1.50` became 1.5 and `1e3` 1000.0, and breakwater then passed "1.5" and "1000.0" where it had passed
    "1.50" and "1e3" before the import."""
    if not isinstance(entry, dict):
        return entry

    def text(value: Any) -> Any:
        return _jsonc.written(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    out = dict(entry)
    for key in ("env", "environment", "headers"):
        if isinstance(table := out.get(key), dict):
            out[key] = {name: text(value) for name, value in table.items()}
    if isinstance(args := out.get("args"), list):
        out["args"] = [text(value) for value in args]
    if isinstance(command := out.get("command"), dict):
        out["command"] = _numbers_as_written(command)
    return out


def _skipped(entry: Any) -> bool:
    # `opencode`: a file that loaded holds a bare `{"enabled": ...}` only if it is OpenCode's (others refuse it).
    return skipped_entry(entry, opencode=True) is not None


def _entry_notes(config: Config) -> list[str]:
    notes = []
    for spec in config.servers:
        for note in spec.notes:
            if NUMBERS_NOTE in note:  # written as strings by the import (`_numbers_as_written`)
                keys = note.split(NUMBERS_NOTE)[0]
                notes.append(f"{spec.name}: {keys}: numbers, written in quotes as the file wrote them (what breakwater passes)")
            elif not note.startswith(tuple(SIGN_IN_KEYS)):
                notes.append(f"{spec.name}: {note}")
    return notes


def _write_all(source: Path, files: dict[Path, str], backup: Path | None) -> None:
    """Write every file, or none: each is written beside its place first, then all are renamed into place.

    The agent's file goes first (`files`' first key, the one most likely refused: a read-only or immutable file), so
    a refusal there leaves the folder as it was; an OSError names the file it could not write, never a staged copy.

    The servers carry their secrets (env values, headers) with them, so no file is left more readable than the
    agent's: a file replaced keeps its permissions, a new one gets the agent file's (a private `~/.claude.json`,
    0600, never becomes a world-readable servers file). A symbolic link (a dotfiles setup) stays a link: what it
    points at is written.
    """
    mode = stat.S_IMODE(source.stat().st_mode)
    staged: dict[Path, tuple[Path, Path]] = {}
    backed_up = False
    try:
        for path, text in files.items():
            target = path.resolve() if path.is_symlink() else path
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, "it is a directory", str(path))
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            staged[path] = (target, tmp)
            _write_private(tmp, text, stat.S_IMODE(target.stat().st_mode) if target.exists() else mode, shown=path)
        if backup is not None:
            shutil.copy2(source, backup)
            backed_up = True
        for path, (target, tmp) in list(staged.items()):
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
            del staged[path]
    except OSError:
        if backed_up and source in staged and backup is not None:  # the agent's file was not replaced: no backup of it
            backup.unlink(missing_ok=True)
        raise
    finally:
        for _, tmp in staged.values():
            tmp.unlink(missing_ok=True)


def _write_private(tmp: Path, text: str, mode: int, *, shown: Path) -> None:
    """`text` into `tmp`, readable by its owner only until it has its final `mode` (an OSError names `shown`)."""
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, mode)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(shown)) from exc


def _clashes(files: dict[Path, str]) -> list[Path]:
    """The files that exist with other content: writing what they already hold (an import run again) loses nothing."""
    clashes = []
    for path, text in files.items():
        try:
            same = path.read_text(encoding="utf-8") == text
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            clashes.append(path)
    return clashes


def import_main(argv: list[str]) -> int:
    """`breakwater config import PATH [--replace] [--force]`."""
    parser = argparse.ArgumentParser(
        prog="breakwater config import",
        description="Turn an mcpServers file into a breakwater config plus the one-entry file your agent should use.",
    )
    parser.add_argument(
        "path",
        type=Path,
        help="the agent's file (.mcp.json, mcp.json, claude_desktop_config.json, .gemini/settings.json, .codex/config.toml)",
    )
    parser.add_argument(
        "--replace", action="store_true", help="replace PATH with the one-entry file (the original is kept as PATH.bak)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite breakwater.toml / breakwater.servers.json if they exist")
    args = parser.parse_args(argv)
    source: Path = args.path
    try:
        files, notes = _plan(source)
    except ConfigError as exc:
        print(f"breakwater: config error: {exc}", file=sys.stderr)
        return 2
    agent_text = files.pop(source)
    agent_path = source if args.replace else source.with_name(f"{source.stem}.breakwater{source.suffix}")
    backup = source.with_name(source.name + ".bak")
    clashes = _clashes(files if args.replace else {**files, agent_path: agent_text})
    if args.replace and backup.exists():
        clashes.append(backup)
    if clashes and not args.force:
        names = ", ".join(str(p) for p in clashes)
        print(f"breakwater: would overwrite {names}\n  fix: pass --force, or move them away first", file=sys.stderr)
        return 2
    try:
        _write_all(source, {agent_path: agent_text, **files}, backup if args.replace else None)
    except OSError as exc:
        where = exc.filename or source.parent
        print(
            f"breakwater: cannot write {where}: {exc.strerror or exc}; nothing was changed\n"
            "  fix: make it (and its folder) writable, or move it away",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {', '.join(str(p) for p in files)}")
    if args.replace:
        print(f"replaced {source} with the one-entry file (original kept as {backup})")
    else:
        # Its path, not its text: the rest of the agent's file (other projects' servers in ~/.claude.json, entries
        # breakwater cannot serve) stays as it was, secrets included, and is not breakwater's to print.
        print(f"wrote {agent_path}: {source.name} with the one entry that starts breakwater; point your agent at it")
    for note in notes:
        print(f"note: {note}")
    print(f"check it with: breakwater status --config {source.parent / TOML_FILE}")
    return 0
