"""How work that touches guest bytes is confined on the host: the unprivileged account, private directories and
limits (accounts.py), what other accounts may reach (access.py), the bubblewrap jail (jail.py) and its seccomp
filter (seccomp.py); the one way to walk beneath a project, a mirror or a config directory (beneath.py; one name
at a directory's descriptor: atfd.py), whether names there fold (cases.py), and where a link leads in a tree as it
will be (resolve.py). And root's own file work under sudo, done as the account that ran sudo (vmsandbox.sudo, a
base module below this folder), reading for them only what they could read themselves (rights.py)."""
