"""Making a session: a run's flags resolved into options (resolve.py), the session created and booted
(create.py), a blueprint's image layer built by booting one (layer.py)."""
