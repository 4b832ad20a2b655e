"""Where each change of a session came from: the steps of the session (steps.py, kept by the host), the guest's
word on which process wrote what (answer.py, from the change journal), each hunk traced to its writers (blame.py),
the whole made for one review (attribute.py) and kept with it (store.py). The model (model.py) is what the review
freezes and every front end shows. Provenance informs a person; it never decides what is safe or what lands."""
