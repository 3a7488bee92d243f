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


#: Words that say nothing about which tool is meant ("the legacy tool", "search tool"): ignored
#: unless the query has no other words.
_GENERIC = frozenset({"a", "an", "the", "to", "of", "for", "and", "or", "in", "on", "with", "tool", "tools", "mcp", "server"})


def _terms(query: str) -> list[str]:
    terms = _words(query)
    specific = [t for t in terms if t not in _GENERIC]
    return specific or terms


def _term_score(term: str, name_words: set[str], desc_words: set[str]) -> float:
    score = 0.0
    if term in name_words:
        score += 3
    elif any(w.startswith(term) or term.startswith(w) for w in name_words if len(w) > 2):
        score += 2
    if term in desc_words:
        score += 1
    elif any(w.startswith(term) for w in desc_words if len(term) > 3):
        score += 0.5
    return score


def rank(entries: Sequence[Entry], query: str, *, limit: int = 10) -> list[tuple[float, Entry]]:
    """Entries that match `query`, best first: name hits weigh more than description hits.

    An entry must match at least half of the query's specific words (generic ones such as "tool"
    do not count), so a query that matches nothing gets an empty answer rather than weak matches.
    """
    terms = _terms(query)
    if not terms:
        return []
    needed = (len(terms) + 1) // 2
    scored: list[tuple[float, Entry]] = []
    for entry in entries:
        name_words = set(_words(entry.name))
        desc_words = set(_words(entry.tool.description or ""))
        hits = [_term_score(term, name_words, desc_words) for term in terms]
        if sum(1 for h in hits if h > 0) < needed:
            continue
        score = sum(hits) + (2 if query.lower() in entry.name.lower() else 0)
        scored.append((score, entry))
    scored.sort(key=lambda pair: (-pair[0], pair[1].name))
    return scored[:limit]
