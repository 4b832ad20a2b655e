"""envd's side of the API, what E2B's SDK speaks inside a sandbox: Connect RPC with the JSON codec (connect.py,
wire.py), the Process and Filesystem services (process.py, filesystem.py), `/files` (files.py), all behind one URL
(routes.py)."""
