"""`vmsandbox ui`: the review and the sessions in a local web page — one more edge beside `cli/`.

It reaches only the core's surface (core.views, core.reviews, core.watch, core.sessions; the architecture test
holds it): the page shows the same frozen review the terminal shows, and its choices go back through the same
core functions, as its own Person (person.py). It is served on 127.0.0.1 only, behind a
random token, with Host and Origin checked and a strict Content Security Policy (pageguard.py); nothing is loaded
from outside the machine. Guest bytes never become markup: every name, diff line and log line is escaped by the
templates, and syntax highlighting comes back from a jailed lexer as (class, text) pairs (highlight.py).
"""
