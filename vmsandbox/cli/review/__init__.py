"""A session's changes: diff, pull, push, the review in the browser (`ui`), and the person at this terminal who
is asked (prompts.py)."""
