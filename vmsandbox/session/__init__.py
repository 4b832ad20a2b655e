"""Sessions: the record and its states, the typed options, settings, creating and booting a session, its
lifecycle to the end (nothing lost), state and gc, published port choice, layer builds, doctor.

May import: sync, egress, image, guest, vm and the base modules. Never cli.
"""
