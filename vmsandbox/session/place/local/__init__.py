"""This machine as a place a session's VM lives (place.py: LocalHost, LocalVM and what they reach): starting it warm or
cold (start.py, bootwait.py; template.py: templates beside the image), its disks at checkpoints and forks
(disks.py).

May import: the ground of session (place, common, record, checkpoints, templatekey, boot, chain, pins, hostspec), sync,
egress, image, guest, vm and the base modules. Never session.remote, session policy or cli
(tests/unit/test_architecture.py holds it).
"""
