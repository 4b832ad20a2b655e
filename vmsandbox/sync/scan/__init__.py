"""Scanning contents, both ways: credentials going in and coming back, and pickles that name code
(credentials.py), in a jailed process of their own (worker.py); and syntax highlighting of guest text for the
page, by a jailed lexer that hands back (class, text) pairs (highlight.py, highlightworker.py)."""
