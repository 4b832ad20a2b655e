"""Trees on the host, read safely (no link followed): a tree's manifest (manifest.py), trees read without a
walk (views.py), hashes kept between scans (hashcache.py), the mirror's stand-ins for the baseline's files
(placeholders.py), and the project as it will be after a review is applied, where links are judged (final.py)."""
