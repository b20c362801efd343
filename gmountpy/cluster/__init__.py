"""A cluster as described and as running: the cluster file (config), the overlay of sites and
RTTs, the launcher's state files, and the mounts of this machine.

Nothing here imports the daemon, trio or the network: per-job wrappers import `mounts` alone.
"""
