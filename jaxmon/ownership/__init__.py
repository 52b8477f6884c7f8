"""The ownership wing: who owns each device and process, and the one transform that writes it on series.

Sources give readings (jaxmon.sources: the kubelet's allocations and DRA claims, the API server's ResourceSlices and
pods, each process's cgroup); this package resolves them into owners and labels series with them:

- `attribution.py`: the kubelet's device-plugin allocations as owners by device identity (pure);
- `dra.py`: DRA claims resolved through the node's ResourceSlices into owners by device identity (pure);
- `pidowners.py`: the processes on the GPUs named by their cgroups and the API server's pods (owners by pid);
- `owners.py`: the owner transform, between the snapshot and the exposition, the one step that writes `namespace`,
  `pod` and `container` on series.

The wing imports sources, never a collector; no source imports the wing (tests/unit/test_layout.py holds both).
"""
