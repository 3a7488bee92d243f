"""Test kit for people who test their own code against breakwater, and for breakwater's own tests.

`server` is the misbehaving MCP test server (`breakwater testserver`).
"""
