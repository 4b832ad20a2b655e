"""How work that touches guest bytes is confined on the host: the unprivileged account, private directories and
limits (accounts.py), what other accounts may reach (access.py), the bubblewrap jail (jail.py) and its seccomp
filter (seccomp.py). And root's own file work under sudo, done as the account that ran sudo (sudo.py)."""
