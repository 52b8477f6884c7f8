"""Where the scheduler put a workload process, from its environment (the Downward API, Slurm)."""

from __future__ import annotations

from jaxmon.identity import scheduler_labels


def test_the_downward_api_and_slurm_variables_become_labels_where_set() -> None:
    environ = {"POD_NAME": "llama-0", "POD_NAMESPACE": "research", "NODE_NAME": "n7", "SLURM_JOB_ID": "42"}
    assert scheduler_labels(environ) == {"pod": "llama-0", "namespace": "research", "node": "n7", "slurm_job_id": "42"}
    assert scheduler_labels({"POD_NAME": "p", "SLURM_JOB_ID": ""}) == {"pod": "p"}  # empty is not set
    assert scheduler_labels({}) == {}
    assert len(scheduler_labels({"POD_NAME": "x" * 1000})["pod"]) == 253
