"""The everyday verbs on sessions: run (and the agents), create, start, stop, shell, exec, cp, ls, inspect, logs,
rm."""
