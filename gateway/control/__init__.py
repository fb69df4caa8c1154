"""The control plane: the pod registry and what keeps it current (discovery, the dead-pod
reaper, the supervised background tasks), index snapshots (persistence), replica sync
(replication), pinning and the admin API."""
