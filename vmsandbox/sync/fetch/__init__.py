"""The guest's tree brought into the host's mirror: the mirror (mirror.py) and where it lives, in a file system
of its own under root whose length is its bound (volume.py), rsync with its host side unprivileged and jailed
(rsync.py), what a transfer may spend and what it spent (meter.py, spend.py), the guest's change journal
(journal.py), what the mirror holds beside the baseline (delta.py)."""
