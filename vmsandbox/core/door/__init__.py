"""The front ends' one door: who is at the other end of a connection, as the kernel says (kernel.py), and the gate
every connection to the page (`vmsandbox ui`) and to the API (`vmsandbox serve`) passes before the HTTP server
holds a slot for it (gate.py): another account is answered and closed as it is made, a connection of the person
gets HEAD_TIMEOUT seconds to send a whole request head. Written once, so the page and the API cannot differ.

May import: the base modules only (the standard library's sockets and asyncio; no web library).
"""
