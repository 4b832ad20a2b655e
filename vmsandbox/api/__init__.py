"""`vmsandbox serve`: sessions driven from code — a third edge beside `cli/` and `web/`.

E2B's protocol where E2B has the operation (its control plane; envd's process and filesystem services over
Connect, and its /files), so that E2B's own SDK drives vmsandbox sessions unchanged; vmsandbox's extension for
what E2B lacks (sessions on a project, a frozen review, apply, rollback, fork) under /vmsandbox/v1.

It calls the core's one narrow interface (core/sandbox/interface.py: Backend, and Processes and Files bound to a
session) with values validated once (core/sandbox/names.py) and typed data (core/sandbox/model.py); the wire
formats stay here: envd's side in envd/, the control plane and the extension in plane/. Served on 127.0.0.1 or a
0600 Unix socket only, behind an API key kept in memory, with Host and Origin checked and other accounts refused
(keyguard.py, peer.py). What a running serve keeps between requests (where it runs, its settings for E2B's
SDK, its port, its log): servefiles.py, with running.py. Nothing imports it but cli/serve.py; it imports no
cli/ and no web/.
"""
