"""The core: the one way every front end (the terminal in cli/, the page in web/, the HTTP API in api/) reaches a
session. A run's whole order (flow.py), reviews and their apply (reviews.py), and the port through which they
ask a person (person.py), which each front end implements.

May import: session, sync, egress, image, guest, vm and the base modules. Never a front end.
"""
