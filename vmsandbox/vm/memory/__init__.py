"""A guest's memory shared between VMs: a save image split into its RAM and the rest (split.py), the RAM sealed in
a memfd nobody can change (sealed.py), and the process of QEMU's account that holds it where QEMU opens it
(hold.py, run as `python -m vmsandbox.vm.memory.hold`), and root's records of those holders (holders.py); what a
VM's process takes of the host's memory, shared and private (usage.py); and root's looks at what a holder or a
QEMU holds, made in a helper process where a hang costs nothing (foreign.py, the helper: look.py, run as
`python -m vmsandbox.vm.memory.look`).

May import: the base modules (vmsandbox.proc, pids, errors) and vm.savefile. Nothing above.
"""
