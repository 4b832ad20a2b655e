"""Where a session's VM lives: the interfaces (interface.py: Host with Images and Facts, VM with Saved, Snapshots
and Forks, and Abilities as data), the one chooser (choose.py), the two places (local/: this machine; remote/:
another libvirt host), and the ground both stand on: what they do the same way (common.py), what a warm-start
template is (templates.py), the console read while a VM boots (console.py), the
qcow2 chain (chain.py), checkpoints as data (checkpoints.py), the hosts a session may run on (hostspec.py), what
other accounts' sessions rest on (pins.py), whether a host has room for one more session (room.py). Policy
reaches a place only through choose.py."""
