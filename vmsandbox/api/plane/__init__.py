"""The API's control plane: E2B's (control, controlwire), vmsandbox's extension for reviews, checkpoints and
forks (extension, extwire), and the OpenAPI description of both (openapi)."""
