"""The door's rules as pure functions, no I/O: which names and addresses a guest may reach (netpolicy.py,
addresses.py), how a request's head and a TLS hello are read (httphead.py, tlshello.py), what a terminated tunnel
may carry (inject.py), which secret goes where (mapping.py), and what one daemon may take (limits.py)."""
