"""`vmsandbox ui`: the review and the sessions in a local web page — one more edge beside `cli/`.

It reaches the core as the CLI does (session.lifecycle, sync.plan): the page shows the same plan the terminal
shows and hands back the same Decisions to the same apply code. It is served on 127.0.0.1 only, behind a
random token, with Host and Origin checked and a strict Content Security Policy (guard.py); nothing is loaded
from outside the machine. Guest bytes never become markup: every name, diff line and log line is escaped by the
templates, and syntax highlighting comes back from a jailed lexer as (class, text) pairs (highlight.py).
"""
