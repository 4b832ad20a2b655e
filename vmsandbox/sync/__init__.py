"""The workspace and what comes back from it: the capture, the mirror of the guest's tree (filled by an
unprivileged rsync), manifests, the three-way comparison, risky paths, the plan of a review, applying it,
the outbox, the guest's commits, push.

May import: guest, vm and the base modules. Never session or cli: the session layer says where the guest's
changes come from and hands over what sync needs.
"""
