"""Carrying a guest's request upstream: the asyncio proxy (proxy), its streams and TLS (streams, certs), a body
framed exactly as its head says (body), upstreams reached by checked addresses only (upstream, ownaddr)."""
