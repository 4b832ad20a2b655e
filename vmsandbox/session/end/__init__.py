"""The end of a session, never with unreviewed work: the review and the decisions carried out, the outbox, the
VM and files removed (lifecycle.py); a dead VM's disk read in a reader VM (diskreader.py); the background
teardown (teardown.py); gc (gc.py)."""
