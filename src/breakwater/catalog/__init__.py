"""Stage 3, catalog: what tools exist, under which names, and whether they changed.

Owns downstream namespacing, the last-known tool lists kept on disk, definition-drift fingerprints and
the ranking behind tool search. May import the core leaves, `config` and `connect` types.
"""
