"""Tool search ranking: which catalog entries match a query, best first.

Name hits weigh more than description hits. Imports only the catalog's `Entry`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from breakwater.catalog._catalog import Entry

__all__ = ["rank"]

_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    # Split snake_case, kebab-case and camelCase alike.
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return _WORD.findall(spaced.lower())


def rank(entries: Sequence[Entry], query: str, *, limit: int = 10) -> list[tuple[float, Entry]]:
    """Entries that match `query`, best first: name hits weigh more than description hits."""
    terms = _words(query)
    if not terms:
        return []
    scored: list[tuple[float, Entry]] = []
    for entry in entries:
        name_words = set(_words(entry.name))
        desc_words = _words(entry.tool.description or "")
        desc_set = set(desc_words)
        score = 0.0
        for term in terms:
            if term in name_words:
                score += 3
            elif any(w.startswith(term) or term.startswith(w) for w in name_words if len(w) > 2):
                score += 2
            if term in desc_set:
                score += 1
            elif any(w.startswith(term) for w in desc_set if len(term) > 3):
                score += 0.5
        if query.lower() in entry.name.lower():
            score += 2
        if score > 0:
            scored.append((score, entry))
    scored.sort(key=lambda pair: (-pair[0], pair[1].name))
    return scored[:limit]
