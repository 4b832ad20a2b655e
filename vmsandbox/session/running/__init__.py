"""A running session changed while it runs: what it may reach and which ports are published (reach.py), its
volatile credentials wiped (clean.py), a subscription login kept for later sessions (logins.py)."""
