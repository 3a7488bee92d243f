"""JSON with comments: the agents' config files as their editors write them.

VS Code reads its `mcp.json` as JSONC (`//` and `/* */` comments, a comma before a closing bracket),
and users write such files by hand; Cursor's and Claude's are often edited in the same editor.
Refusing them as "invalid JSON" would make a user strip their own notes before breakwater reads the
file. `strip` blanks what JSON does not allow, and keeps every other character where it was, so a
real syntax error after a comment is still reported at its own line and column.

A number is read with the text the file wrote it in (`number`, `written`): a number where a string goes (VS Code's
`env` takes one) is passed as written, `1.50` as "1.50" and `1e3` as "1e3", not as Python spells the value.
"""

from __future__ import annotations

__all__ = ["WrittenFloat", "number", "strip", "written"]


class WrittenFloat(float):
    """A JSON number that is no plain integer, with the text the file wrote it in (`1.50`, `1e3`, `-0`)."""

    written: str

    def __new__(cls, text: str) -> WrittenFloat:
        value = super().__new__(cls, text)
        value.written = text
        return value


def number(text: str) -> int | float:
    """A JSON number (the parser's `parse_int` and `parse_float`): an int as it is, any other with its text kept."""
    if text.lstrip("-").isdigit() and text != "-0":
        return int(text)
    return WrittenFloat(text)


def written(value: int | float) -> str:
    """A number as the file wrote it (`number`), or as Python writes it when it came from elsewhere."""
    return value.written if isinstance(value, WrittenFloat) else str(value)


def strip(text: str) -> str:
    """`text` with comments and trailing commas turned into spaces (newlines kept); strings untouched."""
    out = list(text)
    n = len(text)
    i = 0
    comma = -1  # a comma outside strings with only whitespace or comments after it so far
    while i < n:
        c = text[i]
        if c == '"':
            comma = -1
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            continue
        if c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out[i:end] = " " * (end - i)
            i = end
            continue
        if c == "/" and text.startswith("/*", i):
            close = text.find("*/", i + 2)
            if close < 0:  # unterminated: left for the parser to report where it starts
                break
            out[i : close + 2] = ("\n" if ch == "\n" else " " for ch in text[i : close + 2])
            i = close + 2
            continue
        if c == ",":
            comma = i
        elif c in "}]":
            if comma >= 0:
                out[comma] = " "
            comma = -1
        elif not c.isspace():
            comma = -1
        i += 1
    return "".join(out)
