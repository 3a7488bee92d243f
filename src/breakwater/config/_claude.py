"""Claude Code's answers about a project's `.mcp.json` servers: which it starts, which it does not, and why.

Claude Code asks before it starts a server of a project's `.mcp.json` (anyone can commit one) and keeps the
answer in its settings files:

* `disabledMcpjsonServers` (rejected) in `~/.claude/settings.json`, the project's `.claude/settings.json` or
  `.claude/settings.local.json`, or the project's entry of `~/.claude.json` (older versions kept it there;
  `disabledMcpServers` there is its `/mcp` panel's switch): a rejected server is never started;
* `enabledMcpjsonServers` (approved) and `enableAllProjectMcpServers` in the user's settings, the project's
  `.claude/settings.local.json` (not when a repository could have written it: the file or `.claude` is a
  symbolic link, `.claude` holds a `.git`, or git tracks the file), the project's entry of `~/.claude.json`, and
  the project's `.claude/settings.json` only once the user trusted the folder (`hasTrustDialogAccepted`).
  The project's entry is `projects[ROOT]` exactly, ROOT its git root (else its folder), as Claude Code keys it:
  a trusted parent folder (a home, a `~/code`) spares the trust prompt but approves nothing of a repository
  cloned under it, whose committed `.claude/settings.json` Claude Code then does not read.

A server neither approved nor rejected is pending: Claude Code asks and, until then, does not start it. So does
breakwater, once Claude Code has answered for any server of the file: a server added to the repository's
`.mcp.json` after the user approved the others is not started behind their back. A file Claude Code never
answered for (one written for breakwater itself, or a project never opened in Claude Code) is served whole, as
breakwater has no one to ask. Names are compared as Claude Code compares them (each character outside
`A-Za-z0-9_-` as `_`). May import the core leaves and `_dialect.py` only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from breakwater.config._dialect import SWITCHED_OFF, claude_project, project_key

__all__ = ["claude_unstarted_servers"]

_REJECTED = "rejected in Claude Code"


def _key(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)


def _read(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _names(settings: Mapping[str, Any], field: str) -> list[str]:
    names = settings.get(field)
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def local_settings_gated(folder: Path) -> str | None:
    """Why Claude Code ignores the approvals in `folder/.claude/settings.local.json` (a repository could have written
    it), or None. Claude Code also ignores them in a folder that is no git repository; breakwater does not (no
    repository committed the file), so the approvals tests and hand-made folders rely on keep working."""
    claude = folder / ".claude"
    if claude.is_symlink() or (claude / "settings.local.json").is_symlink():
        return "it (or .claude) is a symbolic link"
    if (claude / ".git").exists():
        return ".claude holds a .git"
    git = shutil.which("git")
    # No file, no approvals to gate: every `.mcp.json` load (each `serve`, `status`) would start a git for nothing.
    if git is None or not (claude / "settings.local.json").exists():
        return None
    try:
        # As Claude Code asks git: no hooks or fsmonitor of the repository's own run for it.
        safe = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor="]
        done = subprocess.run(
            [git, *safe, "-C", str(folder), "ls-files", "--error-unmatch", "--", ":(icase).claude/settings.local.json"],
            capture_output=True,
            timeout=2,
            check=False,
            env={**os.environ, "GIT_LITERAL_PATHSPECS": ""},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return "git tracks it (it came with the repository)" if done.returncode == 0 else None


def _own_project(data: Mapping[str, Any], folder: Path) -> Mapping[str, Any] | None:
    """The entry of `~/.claude.json` that is this project's own (its trust, its older approvals), or None.

    Claude Code keys it by the git root of the folder it runs in (else the folder), and reads approvals and trust
    there only: the nearest entry above (`claude_project`) may be a parent folder's, trusted for the parent alone.
    """
    root = next((d for d in (folder, *folder.parents) if (d / ".git").exists()), folder)
    found = claude_project(data, root)
    if found is None or not isinstance(found[1], dict):
        return None
    key, entry = found
    return entry if (key.replace("\\", "/").rstrip("/") or "/") == (root.as_posix().rstrip("/") or "/") else None


def _trusted(project: Mapping[str, Any] | None) -> bool:
    """Whether the user trusted the folder in Claude Code (then every settings file's approvals count)."""
    return project is not None and project.get("hasTrustDialogAccepted") is True


def _approvals(
    settings: Mapping[Path, Mapping[str, Any]], folder: Path, project: Mapping[str, Any] | None, gated: str | None, state: Path
) -> list[tuple[str, Mapping[str, Any]]]:
    """Where Claude Code reads approvals for this project, as (where, settings), in the order it reads them: `settings`
    are the settings files as read, `gated` why the local one does not count (`local_settings_gated`)."""
    user = Path.home() / ".claude" / "settings.json"
    shared, local = folder / ".claude" / "settings.json", folder / ".claude" / "settings.local.json"
    trusted = _trusted(project)
    found: list[tuple[str, Mapping[str, Any]]] = [(str(user), settings[user])]
    if trusted or shared.resolve() == user.resolve():
        found.append((str(shared), settings[shared]))
    if trusted or gated is None:
        found.append((str(local), settings[local]))
    if project is not None:
        found.append((f"{state}", project))
    return found


def claude_unstarted_servers(mcp_json: Path, names: Iterable[str]) -> dict[str, str]:
    """The servers of a project's `.mcp.json` (named `names`) Claude Code does not start, each with why and the fix."""
    if mcp_json.name != ".mcp.json":
        return {}
    state = Path.home() / ".claude.json"
    data = _read(state)
    found = claude_project(data, mcp_json.parent.resolve())
    project = found[1] if found is not None and isinstance(found[1], dict) else None
    where = project_key(found[0]) if found is not None else ""
    folder = mcp_json.parent
    said: dict[str, str] = {}
    local = folder / ".claude" / "settings.local.json"
    files = [folder / ".claude" / "settings.json", local, Path.home() / ".claude" / "settings.json"]
    settings = {file: _read(file) for file in files}  # each read once (a repeated path reads as the same file)
    for file in settings:
        for name in _names(settings[file], "disabledMcpjsonServers"):
            fix = f"remove {json.dumps(name)} from disabledMcpjsonServers in {file}"
            said.setdefault(_key(name), f"disabledMcpjsonServers in {file} lists it ({_REJECTED}); to start it, {fix}")
    for field, why in (("disabledMcpjsonServers", _REJECTED), ("disabledMcpServers", SWITCHED_OFF)):
        for name in _names(project or {}, field):
            # Named as that list writes it: the name in `.mcp.json` may differ in the characters Claude Code replaces.
            fix = f"remove {json.dumps(name)} from {where}.{field} in {state}"
            if field == "disabledMcpServers":
                fix = f"switch it on in Claude Code's /mcp (or {fix})"
            said.setdefault(_key(name), f"{where}.{field} in {state} lists it ({why}); to start it, {fix}")
    names = list(names)
    unstarted = {name: said[_key(name)] for name in names if _key(name) in said}
    # Rejections above may come from a parent's entry (a "no" is never wrong to honour); trust and approvals not.
    own = _own_project(data, mcp_json.parent.resolve())
    ignored = None if _trusted(own) else local_settings_gated(folder)
    sources = _approvals(settings, folder, own, ignored, state)
    everything = any(settings.get("enableAllProjectMcpServers") is True for _, settings in sources)
    approved = {_key(n) for _, settings in sources for n in _names(settings, "enabledMcpjsonServers")}
    if everything or not ({_key(n) for n in names} & (approved | set(said))):
        return unstarted  # all approved, or Claude Code never answered for this file: nobody to ask
    listed_locally = {_key(n) for n in _names(settings[local], "enabledMcpjsonServers")}
    for name in names:
        if name in unstarted or _key(name) in approved:
            continue
        why = "not approved in Claude Code, which asks before it starts a server of a project's .mcp.json"
        if ignored is not None and _key(name) in listed_locally:
            why += f" ({local} lists it in enabledMcpjsonServers, but Claude Code ignores approvals there: {ignored})"
        by_hand = _approve(name, local, ignored)
        unstarted[name] = f"{why}; to start it, approve it in Claude Code (run claude in {folder.resolve()}) or {by_hand}"
    return unstarted


def _approve(name: str, local: Path, ignored: str | None) -> str:
    """How to approve `name` by hand: where Claude Code writes its own approval, the project's local settings, unless
    Claude Code ignores approvals there; then the user's settings, which approve the name in every project."""
    if ignored is None:
        return f"add {json.dumps(name)} to enabledMcpjsonServers in {local.resolve()}, where Claude Code keeps its approvals"
    user = Path.home() / ".claude" / "settings.json"
    return f"add {json.dumps(name)} to enabledMcpjsonServers in {user} (which approves that name in every project)"
