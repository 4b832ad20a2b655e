"""Reaching into a guest: SSH endpoints and pinned keys, commands over ssh, the one paramiko module (channel.py),
the files and environment copied in at boot, the guest user.

May import: vm and the base modules.
"""
