"""This machine as a place a session's VM lives (place.py: LocalHost, LocalVM and what they reach): starting it warm or
cold (start.py, bootwait.py; template.py: templates beside the image), its disks at checkpoints and forks
(disks.py), templates' and forks' memory mapped copy-on-write (sharing.py).

May import: the ground of session (session.record and place's interface, common, checkpoints, templates, console,
chain, pins, hostspec, room), sync, egress, image, guest, vm and the base modules. Never session.place.remote,
session policy or cli (tests/unit/test_architecture.py holds it).
"""
