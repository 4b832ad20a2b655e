"""`--format` templates: the subset of Go's text/template that docker users write, our own small implementation.

lexer.py (the text as tokens, each at its offset; what is outside the subset refused where it stands), tree.py (the
tokens as a tree: text, actions, `if`/`else`, `range`; syntax and the functions' arguments checked), functions.py
(how Go shows and judges a value; json, upper, lower, join, printf and the others), execute.py (a tree run on a row,
and a `table`'s headers: the fields' names), checked.py (a --format value checked against a listing's fields: the
one entry, whose errors show the template with a caret under the column).

May import: vmsandbox.errors, vmsandbox.ui. Nothing of the core: it knows rows as dicts, nothing of sessions.
"""
