"""The guest's one door out: the allowlist policy (pure rules), HTTP and TLS head parsing, the asyncio proxy,
the session CA, host-side secrets, the proxy daemon and its log, published ports.

May import: guest, vm and the base modules. Never session, sync, image or cli.
"""
