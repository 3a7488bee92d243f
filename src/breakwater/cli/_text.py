"""Text that comes from a config file or a server, as the terminal shows it: never read as Rich markup, never obeyed.

A server named `m[/]` crashed `status` (Rich read the name as a closing tag), one named `m[x]` was shown as `m`, and a
tool description or an error message holding an escape sequence drove the user's terminal. Every such text goes
through one of these on its way to a console: `markup` inside a markup string, `cell` as a table cell, `lines` for a
text of several lines printed as it is.
"""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text

from breakwater.errors import visible

__all__ = ["cell", "lines", "markup"]


def markup(text: str) -> str:
    """`text` for a Rich markup string: its brackets escaped, its control and invisible characters shown as `\\uXXXX`."""
    return escape(visible(text))


def cell(text: str) -> Text:
    """`text` as a table cell (Rich parses a plain string cell as markup)."""
    return Text(visible(text))


def lines(text: str) -> str:
    """A text of several lines (a tool's result, an answer) for `print`: its line breaks and tabs kept, other
    control characters shown as `\\uXXXX`."""
    return visible(text, keep="\n\t")
