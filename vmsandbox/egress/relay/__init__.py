"""Carrying a guest's request upstream: the asyncio proxy (proxy.py), its streams and TLS (streams.py, certs.py), a
body framed exactly as its head says (body.py), upstreams reached by checked addresses only (upstream.py,
ownaddr.py)."""
