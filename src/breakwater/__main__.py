"""`python -m breakwater`: the `breakwater` program."""

import os
import sys

# The test suite's gateways (and its other commands that load the SDK) start as forks of a process that imported it
# once (`breakwater.testing._launcher` says when and why); nothing is imported before this, so a plain start pays
# nothing for it. The variable is `_launcher.SERVE_ENV`, spelt out so that nothing is imported first
# (tests/testing/test_fork_server.py forks through it by that name, so the two cannot part unnoticed).
if sys.argv[1:2] in (["serve"], ["status"], ["call"], ["tools"]) and (
    _fork_server := os.environ.get("BREAKWATER_TEST_FORK_SERVE")
):
    from breakwater.testing._launcher import hand_over

    hand_over(_fork_server, sys.argv[1:])

from breakwater.cli import run

run()
