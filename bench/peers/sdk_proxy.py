"""The floor for one Python hop: a bare pass-through proxy on the SDK's low-level server, no gate.

    python bench/peers/sdk_proxy.py -- UPSTREAM_COMMAND [ARGS...]      # stdio in, stdio upstream
    python bench/peers/sdk_proxy.py --http PORT_FILE [--json] -- UPSTREAM_COMMAND [ARGS...]
                                                                       # streamable HTTP on 127.0.0.1

`bench/proxy_overhead.py` runs it as the `sdk-proxy` reference target: the difference between it and
`breakwater-stdio` is what breakwater adds beyond the SDK's own cost of serving and calling. Over
HTTP (`sdk-proxy-http-json`) it is the same floor for `breakwater serve --http --json-response`.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server


async def main(command: list[str], port_file: str | None = None, json_response: bool = False) -> None:
    async with Client(StdioServerParameters(command=command[0], args=command[1:]), mode="legacy") as upstream:

        async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
            return await upstream.list_tools()

        async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
            return await upstream.call_tool(params.name, params.arguments or {})

        server = Server("sdk-proxy", on_list_tools=list_tools, on_call_tool=call_tool)
        if port_file is None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            return
        import uvicorn

        from breakwater.gateway._listen import tcp_listener

        sock = tcp_listener("127.0.0.1", 0)
        app = server.streamable_http_app(json_response=json_response)
        with open(port_file, "w") as f:
            f.write(str(sock.getsockname()[1]))
        await uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).serve(sockets=[sock])


if __name__ == "__main__":
    argv = sys.argv[1:]
    port_file = None
    if argv[:1] == ["--http"]:
        port_file, argv = argv[1], argv[2:]
    json_response = argv[:1] == ["--json"]
    argv = argv[1:] if json_response else argv
    anyio.run(main, argv[1:] if argv[:1] == ["--"] else argv, port_file, json_response)
