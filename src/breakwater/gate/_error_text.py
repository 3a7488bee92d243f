"""What a tool's plain-text error says about who is at fault: the request (an unknown tool, rejected arguments, something
not there or not allowed), or the tool and what it depends on.

A server that reports its errors only as text (`isError` with no `structuredContent`) leaves the gate these words to
tell a model's mistake, which no breaker should count, from a tool in trouble, which the breakers must hear about
(`gate._classify`); and, in the words of a tool in trouble, a "try again later", which the model is told as such.
"""

from __future__ import annotations

import re

__all__ = ["ARGUMENTS_REJECTED_TEXT", "UNKNOWN_TOOL_TEXT", "asked_amiss", "says_transient"]

UNKNOWN_TOOL_TEXT = re.compile(r"^\s*unknown tool\b", re.IGNORECASE)
# MCPServer reports bad arguments as "Error executing tool <name>: 1 validation error for <name>Arguments".
ARGUMENTS_REJECTED_TEXT = re.compile(r"^Error executing tool \S+: \d+ validation errors? for ", re.IGNORECASE)
# What a healthy tool answers, in plain text, to a request for something that is not there or not allowed: the
# filesystem server's "ENOENT: no such file or directory" and "Access denied - path outside allowed directories",
# an SDK server's "[Errno 2] No such file or directory", an API's "404 Not Found". Four reads of missing files
# opened the tool's breaker, and then a read of a file that exists was refused CIRCUIT_OPEN (for every client of
# a shared gateway). The model's next call with other input may well succeed: nothing for a breaker to stop.
_ASKED_AMISS = re.compile(
    r"\b(?:not found|no such|does ?n[o']t exist|ENOENT|ENOTDIR|EISDIR|EEXIST|already exists|is a directory|"
    r"not a directory|outside (?:the )?allowed director|access denied|permission denied|EACCES|EPERM|"
    r"invalid (?:argument|input|parameter|path|value|id)s?)\b",
    re.IGNORECASE,
)
# ...unless the same words say a dependency failed: a host name not found (DNS), a refused or reset connection, a
# timeout, an overloaded or failing service. Those are what a breaker is for.
_DEPENDENCY_FAILED = re.compile(
    r"\b(?:ENOTFOUND|EAI_AGAIN|getaddrinfo|host (?:not found|unreachable)|name or service not known|ECONNREFUSED|"
    r"connection (?:refused|reset)|ECONNRESET|ETIMEDOUT|timed? ?out|unavailable|overloaded|rate.?limit|"
    r"too many requests|internal server error|bad gateway|50[0234])\b",
    re.IGNORECASE,
)


def asked_amiss(text: str) -> bool:
    """Whether `text` says the request asked for something not there or not allowed, and not that a dependency failed."""
    return _ASKED_AMISS.search(text) is not None and _DEPENDENCY_FAILED.search(text) is None


# What a tool in trouble answers, in plain text, when a later attempt may work: "temporarily unavailable, try again",
# "rate limited", "please retry". The model read "fix the input or take another approach rather than repeating the same
# call" beside them. Whole phrases only: a bare "try again" also ends a model's mistake ("a valid date, then try again").
# Nor "please retry" that says how to change the request ("please retry with YYYY-MM-DD", "please retry the request
# using a smaller page size", "please retry after fixing the query"): a correction, read as transient, was repeated as
# it was and counted against the tool's breaker.
_CORRECTION = (
    r"[^.;!?\n]*\b(?:with|using|by|providing|passing|specifying|including|once you|"
    r"after (?:fixing|correcting|changing|updating|adding|removing|checking))\b"
)
_TRANSIENT = re.compile(
    r"\b(?:(?:temporarily|currently) (?:unavailable|overloaded|busy|down)|service unavailable|too many requests|"
    rf"rate[ -]?limit(?:ed|s)?|(?:server|service) (?:is )?(?:busy|overloaded)|please retry(?!{_CORRECTION})|"
    r"retry (?:later|shortly|soon|in \d)|"
    r"try (?:again )?(?:later|shortly|soon|in \d+|in a (?:moment|minute|few \w+|little while|while|bit)))\b",
    re.IGNORECASE,
)


def says_transient(text: str) -> bool:
    """Whether `text` says the failure is passing ("temporarily unavailable", "try again later", "rate limited")."""
    return _TRANSIENT.search(text) is not None
