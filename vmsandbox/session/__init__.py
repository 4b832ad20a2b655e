"""Sessions: the record and its states, the typed options, settings, creating a session, its lifecycle to the end
(nothing lost), stop/start, checkpoints, forks, fan-outs, state and gc, published port choice, layer builds,
doctor — policy that never asks where a VM lives. That is small interfaces, one concern each (place/interface.py:
Host, VM and what they reach, and each place's Abilities as data) with two implementations, place/local/ (this
machine) and place/remote/ (another libvirt host), chosen in place/choose.py alone.

May import: sync, egress, image, guest, vm and the base modules. Never cli.
"""
