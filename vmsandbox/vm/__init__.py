"""The machine under a session: the libvirt adapter (the only libvirt import), domain XML as data, qemu-img, ext4
images, the accelerator choice and host set-up.

May import: the base modules (vmsandbox.proc, paths, errors, confine, ui). Nothing above.
"""
