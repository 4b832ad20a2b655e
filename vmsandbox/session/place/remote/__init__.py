"""Another libvirt host as a place a session's VM lives (place.py: RemoteHost, RemoteVM and what they reach): its
images and sessions' disks as volumes in that host's pool (images.py, vm.py), starting there warm or cold
(start.py; template.py: that host's templates), stop and start (save.py), checkpoints (checkpoint.py), forks
(fork.py), its console (log.py), the ssh tunnel that reaches its guest (tunnel.py), and gc there (gc.py).

May import: the ground of session (session.record and place's interface, common, checkpoints, templates, console,
chain, pins, hostspec, room), sync, egress, image, guest, vm and the base modules. Never session.place.local,
session policy or cli (tests/unit/test_architecture.py holds it).
"""
