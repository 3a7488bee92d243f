"""Stage 6, the gateway: breakwater as one MCP server in front of all the others.

Owns the downstream MCP server (tools, built-in search and status tools, pass-through of prompts,
resources and completions), the relay of sampling, elicitation and logs, gateway tasks, the HTTP app
with its auth and host checks, and the status page. May import every lower stage and `Breakwater`;
never the CLI.
"""
