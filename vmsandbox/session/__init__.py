"""Sessions: the record and its states, the typed options, settings, creating a session, its lifecycle to the end
(nothing lost), stop/start, checkpoints, forks, fan-outs, state and gc, published port choice, layer builds,
doctor — policy that never asks where a VM lives. That is one interface, place.Place, with two implementations,
local/ (this machine) and remote/ (another libvirt host), chosen in places.py alone.

May import: sync, egress, image, guest, vm and the base modules. Never cli.
"""
