"""envd's side of the API, what E2B's SDK speaks inside a sandbox: Connect RPC with the JSON codec (connect,
wire), the Process and Filesystem services (process, filesystem), `/files` (files), all behind one URL (routes)."""
