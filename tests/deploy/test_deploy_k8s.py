"""deploy/k8s: every manifest validates against the Kubernetes schemas bundled in
kubernetes-validate (strict: unknown fields are errors), the kustomization lists every file,
and the workloads carry what docs/deployment.md promises (probes, resources, replicas, the
HPA bounded by the topic's partitions)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from tests.support.deploy import EVERY_INTERFACE, K8S, load_yaml, load_yaml_all

KUBERNETES_VERSION = "1.35.0"  # a recent version bundled in kubernetes-validate 1.37.0
KUSTOMIZATION = K8S / "kustomization.yaml"
WORKLOADS = {
    "kgstream-indexer": 9101,
    "kgstream-communities": 9102,
    "kgstream-query-api": 8000,
}
PROBE_PORTS = {**WORKLOADS, "kgstream-query-api": 8001}  # KGSTREAM_API_PROBE_PORT


def _resources() -> list[dict[str, Any]]:
    names = load_yaml(KUSTOMIZATION)["resources"]
    return [doc for name in names for doc in load_yaml_all(K8S / name)]


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in _resources() if r["kind"] == kind}


def test_kustomization_lists_every_manifest() -> None:
    listed = set(load_yaml(KUSTOMIZATION)["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {KUSTOMIZATION.name}
    assert listed == on_disk


def _resource_id(resource: dict[str, Any]) -> str:
    return f"{resource['kind']}/{resource['metadata']['name']}"


@pytest.mark.parametrize("resource", _resources(), ids=_resource_id)
def test_manifest_is_valid_in_strict_mode(resource: dict[str, Any]) -> None:
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_an_unknown_field() -> None:
    deployment = copy.deepcopy(_by_kind("Deployment")["kgstream-query-api"])
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_resource_is_in_the_namespace() -> None:
    for resource in _resources():
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "kgstream", resource["metadata"]["name"]


def test_deployments_probe_health_and_readiness_with_resources() -> None:
    deployments = _by_kind("Deployment")
    assert set(deployments) == set(WORKLOADS)
    for name, port in PROBE_PORTS.items():
        pod = deployments[name]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = container[probe]["httpGet"]
            assert get["path"] == path, (name, probe)
            assert ports[get["port"]] == port, (name, probe)
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
        assert {"cpu", "memory"} <= set(container["resources"]["limits"]), name
        refs = {next(iter(ref.values()))["name"] for ref in container["envFrom"]}
        assert refs == {"kgstream-config", "kgstream-secrets"}, name
        assert pod["securityContext"]["runAsNonRoot"] is True
    assert deployments["kgstream-query-api"]["spec"]["replicas"] >= 2


def test_metrics_listen_on_every_interface_of_the_pod() -> None:
    data = _by_kind("ConfigMap")["kgstream-config"]["data"]
    assert data["KGSTREAM_INDEXER_METRICS_HOST"] == EVERY_INTERFACE
    assert data["KGSTREAM_COMMUNITIES_METRICS_HOST"] == EVERY_INTERFACE
    assert data["KGSTREAM_API_HOST"] == EVERY_INTERFACE
    assert data["KGSTREAM_AUTH"] == "required"
    assert data["KGSTREAM_INDEXER_METRICS_PORT"] == str(WORKLOADS["kgstream-indexer"])
    assert data["KGSTREAM_COMMUNITIES_METRICS_PORT"] == str(WORKLOADS["kgstream-communities"])


def test_indexer_hpa_is_bounded_by_the_partitions() -> None:
    hpa = _by_kind("HorizontalPodAutoscaler")["kgstream-indexer"]
    partitions = int(_by_kind("ConfigMap")["kgstream-config"]["data"]["KGSTREAM_TOPIC_PARTITIONS"])
    assert hpa["spec"]["scaleTargetRef"]["name"] == "kgstream-indexer"
    assert hpa["spec"]["maxReplicas"] == partitions
    assert 1 <= hpa["spec"]["minReplicas"] <= partitions


def test_migration_job_and_disruption_budgets() -> None:
    job = _by_kind("Job")["kgstream-migrate"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["db", "upgrade"]
    budgets = {
        budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for budget in _by_kind("PodDisruptionBudget").values()
    }
    assert "query-api" in budgets
    services = _by_kind("Service")
    assert set(services) == set(WORKLOADS)
    for name, port in WORKLOADS.items():
        assert services[name]["spec"]["ports"][0]["port"] == port


def test_secret_holds_placeholders_only() -> None:
    secret = _by_kind("Secret")["kgstream-secrets"]["stringData"]
    assert "CHANGE-ME" in secret["KGSTREAM_DATABASE_URL"]
    assert secret["KGSTREAM_OPENAI_API_KEY"] == ""
