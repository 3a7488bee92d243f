"""A stdio MCP server that breaks the rules on purpose, written by hand (the SDK's servers cannot).

    python broken_upstream.py [--junk N] [--bad-tools] [--non-finite] [--rude] [--swallow-unknown | --modern-only]

Speaks 2025-11-25 JSON-RPC over stdio, one message per line. `--bad-tools` lists, beside the valid
`echo` and `big`, a tool whose inputSchema is not an object, one with no inputSchema at all, a
second `echo` and one named "".
`--non-finite` writes NaN and Infinity, which JSON does not have (Python's `json.dumps` does by
default): a tool `bounded` whose schema has `"maximum": Infinity`, and a tool `measure` that answers
`structuredContent` and `_meta` holding NaN, Infinity and -Infinity beside finite values, after
progress notifications holding them too.
`--swallow-unknown` never answers a method it does not know (`server/discover` included), as some
servers do. `--modern-only` speaks 2026-07-28 alone: it answers `server/discover`, refuses
`initialize` with -32022, and marks every result `resultType: "complete"`.
`--junk N` writes N lines that are not JSON-RPC on stdout before every answer. Tool `big` answers
with a text of `arguments.bytes` bytes; `echo` answers with its arguments. `--rude` lists two more: `noisy` sends
`arguments.notes` progress notifications without a progressToken and a log message of a level that
does not exist before it answers; `malformed` answers with an envelope that is no JSON-RPC
response, as `arguments.shape` says: "null" (`"result": null`), "string" (`"error": "..."`) or "none"; or
with a result whose `content` is no list ("notlist"); `die` exits mid-call (code 3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

GOOD = [
    {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
    {"name": "big", "description": "a large answer", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
]
#: Listed with `--rude`: tools whose answers break the protocol.
RUDE = [
    {"name": "noisy", "description": "notifications that do not validate", "inputSchema": {"type": "object"}},
    {"name": "malformed", "description": "an answer that is no JSON-RPC response", "inputSchema": {"type": "object"}},
    {"name": "die", "description": "the process exits mid-call", "inputSchema": {"type": "object"}},
]
NON_FINITE = [
    {"name": "bounded", "inputSchema": {"type": "object", "properties": {"x": {"type": "number", "maximum": float("inf")}}}},
    {"name": "measure", "description": "a sensor that fails", "inputSchema": {"type": "object"}},
]
BAD = [
    {"name": "broken_schema", "description": "its schema is a string", "inputSchema": "not a schema"},
    {"name": "no_schema", "description": "no inputSchema at all"},
    {"name": "echo", "description": "a second echo", "inputSchema": {"type": "object"}},
    {"name": "", "description": "a tool without a name", "inputSchema": {"type": "object"}},
    # An object, as MCP asks, but no JSON Schema: the model APIs refuse every tool of the agent's for it.
    {"name": "any_type", "inputSchema": {"type": "object", "properties": {"x": {"type": "any"}}}},
]


def _send(message: dict[str, Any], junk: int) -> None:
    out = sys.stdout
    for i in range(junk):
        out.write(f"debug: handling request, step {i}\n")
    out.write(json.dumps(message) + "\n")
    out.flush()


class _Refused(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        self.error = error


def _modern(request: dict[str, Any]) -> dict[str, Any]:
    """The answer of a server that speaks 2026-07-28 only (`--modern-only`)."""
    method = request.get("method")
    if method == "initialize":
        data = {"supported": ["2026-07-28"], "requested": (request.get("params") or {}).get("protocolVersion")}
        raise _Refused({"code": -32022, "message": "Unsupported protocol version", "data": data})
    if method == "server/discover":
        info = {"io.modelcontextprotocol/serverInfo": {"name": "broken", "version": "1"}}
        return {
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}},
            "_meta": info,
            "ttlMs": 0,
            "cacheScope": "private",
        }
    answer = _answer(request, False)
    if method == "tools/list":  # 2026-07-28 list results carry a cache hint
        answer.update(ttlMs=0, cacheScope="private")
    return answer


def _answer(request: dict[str, Any], bad_tools: bool, non_finite: bool = False, rude: bool = False) -> dict[str, Any]:
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "broken", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": GOOD + (BAD if bad_tools else []) + (NON_FINITE if non_finite else []) + (RUDE if rude else [])}
    if method == "ping":
        return {}
    if method == "tools/call":
        arguments = params.get("arguments") or {}
        if params.get("name") == "measure":
            nan, inf = float("nan"), float("inf")
            token = (params.get("_meta") or {}).get("progressToken")
            if token is not None:  # progress that is no number, then one that is
                for progress, total in ((nan, inf), (inf, 2.0), (1.0, inf), (1.0, 2.0)):
                    note = {"progressToken": token, "progress": progress, "total": total}
                    _send({"jsonrpc": "2.0", "method": "notifications/progress", "params": note}, 0)
            structured = {"celsius": nan, "range": [-inf, 40.5, inf], "sensor": {"id": 7, "drift": nan}}
            return {"content": [{"type": "text", "text": "no reading"}], "structuredContent": structured, "_meta": {"q": inf}}
        if params.get("name") == "noisy":
            for i in range(int(arguments.get("notes", 0))):
                _send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": i}}, 0)
            _send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "loud", "data": "x"}}, 0)
        text = "x" * int(arguments.get("bytes", 0)) if params.get("name") == "big" else json.dumps(arguments)
        return {"content": [{"type": "text", "text": text}]}
    raise KeyError(method)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--junk", type=int, default=0)
    parser.add_argument("--bad-tools", action="store_true")
    parser.add_argument("--non-finite", action="store_true")
    parser.add_argument("--rude", action="store_true")
    parser.add_argument("--swallow-unknown", action="store_true")
    parser.add_argument("--modern-only", action="store_true")
    args = parser.parse_args()
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request or "method" not in request:
            continue  # notifications and answers need no reply
        if request["method"] == "tools/call" and (request.get("params") or {}).get("name") == "die":
            sys.stderr.write("about to die\n")
            sys.stderr.flush()
            os._exit(3)
        shape = ((request.get("params") or {}).get("arguments") or {}).get("shape")
        if request["method"] == "tools/call" and shape is not None:
            shapes: dict[str, dict[str, Any]] = {
                "null": {"result": None},
                "string": {"error": "it failed"},
                "none": {},
                "notlist": {"result": {"content": {"type": "text", "text": "x"}}},
            }
            broken = shapes[shape]
            _send({"jsonrpc": "2.0", "id": request["id"], **broken}, 0)
            continue
        try:
            if args.modern_only:
                reply = {"jsonrpc": "2.0", "id": request["id"], "result": {**_modern(request), "resultType": "complete"}}
            else:
                answer = _answer(request, args.bad_tools, args.non_finite, args.rude)
                reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer}
        except _Refused as refused:
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": refused.error}
        except KeyError:
            if args.swallow_unknown:
                continue
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "Method not found"}}
        _send(reply, args.junk)


if __name__ == "__main__":
    main()
