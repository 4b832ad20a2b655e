"""The machine and its hosts, beside any one session: every host asked what it is (hosts.py), every check a
session needs (doctor.py), images removed safely (images.py), what `config trust` shows of a project (trust.py)."""
