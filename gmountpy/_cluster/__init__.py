"""The collaborators behind `gmountpy.api.Cluster`, which stays the one public facade.

    view        ClusterView: the cluster's state (refreshed per call), home node, overlay
    paths       Paths: a user's path -> (namespace path, node to ask)
    requests    Requests: one trio run per call over one ClusterClient; where, listings, reads
    files       Files: where, ls, reads, writes, copies, mkdir, remove, checksums, counters
    staging     Staging: verified replicas in a node's export
    placing     Placer: the node for a job (gmountpy.placement's rule) and the jobs in flight
    execution   Execution: commands run or started on a node, locally or over SSH

Imports flow down this list (execution uses placing; everything uses view).
"""
