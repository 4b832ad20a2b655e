"""Images: the base image recipe and build, the image store (list, current, remove), blueprints and the names
of their layers. (Building a layer boots a VM: that is session.start.layer.)

May import: egress (for the secret mapping type), vm, guest and the base modules.
"""
