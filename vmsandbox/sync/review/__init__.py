"""What the guest changed, as a person reviews it: gathered and compared three ways (gather.py, threeway.py),
judged (risk.py; holds.py: ignored and binary), merged (merge.py), shown (diff.py, hunks.py), grouped when it
is too large (mass.py), planned (plan.py, take.py) and frozen when shown (frozen.py)."""
