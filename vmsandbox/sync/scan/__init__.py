"""Scanning contents, both ways: credentials going in and coming back, and pickles that name code
(credentials.py), in a jailed process of their own (worker.py)."""
