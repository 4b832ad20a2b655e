"""Sandboxes: sessions as a program drives them (E2B's control plane and envd, and vmsandbox's review extension,
through api/): the interface the API calls (interface.py) with its typed values (model.py, names.py), and its one
implementation over the core (backend.py): processes that outlive their caller in the guest (processes.py,
supervisor.py: the guest's side), files (files.py, guestfiles.py: the guest's side)."""
