"""The API's control plane: E2B's (control.py, controlwire.py), vmsandbox's extension for reviews, checkpoints and
forks (extension.py, extwire.py), and the OpenAPI description of both (openapi.py)."""
