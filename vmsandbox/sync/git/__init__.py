"""The guest's commits: its repository read as files (refs.py), git run on the host's repository as its owner
(repository.py), commits fetched into a staging namespace and reviewed like files (fetch.py, review.py)."""
