"""The node daemon: one per node, started by a launcher (see daemon.py)."""
