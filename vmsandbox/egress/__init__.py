"""The guest's one door out, per session: its rules (rules/: pure functions), the carrying of a request upstream
(relay/: the asyncio proxy, TLS, bodies, checked upstreams), the guest's connections over SSH (door/), and around
them the daemon (daemon.py) and what drives it (control.py, held.py), the policy file it re-reads (policy.py),
its log (proxylog.py), secrets kept on the host (secrets.py), the daemon's own account (account.py), published ports
(ports.py).

May import: guest, vm and the base modules. Never session, sync, image or cli.
"""
