"""The door's rules as pure functions, no I/O: which names and addresses a guest may reach (netpolicy,
addresses), how a request's head and a TLS hello are read (httphead, tlshello), what a terminated tunnel may carry
(inject), which secret goes where (mapping), and what one daemon may take (limits)."""
