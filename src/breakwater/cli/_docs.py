"""Regenerate the README's generated blocks (`make docs`): the knob table and the error-code table.

Each block sits between `<!-- NAME:start -->` and `<!-- NAME:end -->`; tests fail when a block and
the code it is rendered from drift apart.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from breakwater.config import all_knobs
from breakwater.config._knobs import render_markdown
from breakwater.gate._envelope import render_error_table

BLOCKS: dict[str, Callable[[], str]] = {
    "knobs": lambda: render_markdown(all_knobs()),
    "errors": render_error_table,
}


def render(text: str) -> str:
    """`text` with every generated block replaced by a fresh rendering."""
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        body = make()

        def fill(match: re.Match[str], body: str = body) -> str:
            return match.group(1) + body + match.group(2)

        text = pattern.sub(fill, text)
    return text


def main(argv: list[str]) -> int:
    """Rewrite each named file in place."""
    for name in argv or ["README.md"]:
        path = Path(name)
        path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
