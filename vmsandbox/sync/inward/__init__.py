"""What goes into the guest: the project captured as a disk (capture.py), what is left out of it (leftout.py:
.vmsandboxignore and credentials), host files copied in (cp.py), host edits pushed in (push.py)."""
