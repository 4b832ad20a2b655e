"""A session over time: stopped and started again (suspend.py), checkpoints and rollback (checkpoint.py), forks
(fork.py), fan-outs from one capture (fanout.py), sessions side by side (compare.py)."""
