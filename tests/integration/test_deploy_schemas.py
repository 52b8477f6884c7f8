"""The Kubernetes manifests validated against schema sets: the core objects against Kubernetes' OpenAPI schemas
(kubernetes-validate, two versions), the PodMonitors and PrometheusRules against the Prometheus Operator's CRDs
(cloudcoil's models: 58,000 lines of pydantic, seconds to import). The rest of the manifests' checks are
tests/unit/test_deploy.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy_files import k8s_documents, named


def _validate_core(doc: dict[str, Any], version: str) -> None:
    """Validate a core Kubernetes object against that version's OpenAPI schema, rejecting unknown fields."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{doc['kind']} {doc['metadata']['name']} (Kubernetes {version}): {exc}") from exc


# Native sidecars (an init container with restartPolicy: Always) need Kubernetes 1.29.
KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]


def _jobset_jobs(jobset: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Each replicated job of a JobSet as the batch/v1 Job the JobSet controller makes of it."""
    for rj in jobset["spec"]["replicatedJobs"]:
        yield {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{jobset['metadata']['name']}-{rj['name']}"},
            "spec": rj["template"]["spec"],
        }


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_core_objects_validate_against_the_schema(version: str) -> None:
    docs = k8s_documents()
    core = [d for d in docs if "." not in d["apiVersion"].split("/")[0] or d["apiVersion"].startswith("rbac.")]
    assert [d["kind"] for d in core] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Job"]
    for doc in core:
        _validate_core(doc, version)
    # The JobSets' pod templates are Jobs' (JobSet's own fields are checked below): the GPU one and the GKE TPU one.
    jobsets = [d for d in docs if d["kind"] == "JobSet"]
    assert len(jobsets) == 2
    for jobset in jobsets:
        for job in _jobset_jobs(jobset):
            _validate_core(job, version)


def test_kubernetes_validation_rejects_a_misspelt_field() -> None:
    (job,) = [d for d in k8s_documents() if d["kind"] == "Job"]
    job["spec"]["template"]["spec"]["containers"][0]["volumMounts"] = []
    with pytest.raises(AssertionError, match="volumMounts"):
        _validate_core(job, KUBERNETES_VERSIONS[-1])


def _prometheus_operator_model(kind: str) -> Any:
    # The Prometheus Operator's CRDs as pydantic models (cloudcoil's generated package), imported by name so that
    # mypy does not type-check its 58,000 lines.
    import importlib

    return getattr(importlib.import_module("cloudcoil.models.prometheus_operator.v1"), kind)


def _validate_custom(doc: dict[str, Any]) -> None:
    """Validate a PodMonitor or PrometheusRule against the operator's CRD schema; unknown fields fail too (the
    models ignore them, so the round trip would lose them)."""
    from pydantic import ValidationError

    try:
        model = _prometheus_operator_model(doc["kind"]).model_validate(doc)
    except ValidationError as exc:
        raise AssertionError(f"{doc['kind']}: {exc}") from exc
    dumped = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    assert dumped == doc, f"{doc['kind']}: fields the CRD does not define (lost in a round trip)"


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("PodMonitor", "jaxmon"),
        ("PodMonitor", "jaxmon-node"),
        ("PrometheusRule", "jaxmon"),
        ("PrometheusRule", "jaxmon-job"),
        ("PrometheusRule", "jaxmon-fleet"),
    ],
)
def test_prometheus_operator_objects_validate_against_their_crds(kind: str, name: str) -> None:
    (doc,) = [d for d in k8s_documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    _validate_custom(doc)
    misspelt = json.loads(json.dumps(doc))
    misspelt["spec"]["selectr" if kind == "PodMonitor" else "groupz"] = {}
    with pytest.raises(AssertionError, match="fields the CRD does not define"):
        _validate_custom(misspelt)
    if kind == "PodMonitor":
        wrong_type = json.loads(json.dumps(doc))
        wrong_type["spec"]["podMetricsEndpoints"][0]["interval"] = 15
        with pytest.raises(AssertionError, match="interval"):
            _validate_custom(wrong_type)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_node_daemonsets_rbac_validates_against_the_schema(version: str) -> None:
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        _validate_core(named(kind, "jaxmon-node"), version)
