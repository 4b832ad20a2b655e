"""What lands on the host: accepted changes written (write.py), unsynced ones kept in the outbox (outbox.py)."""
