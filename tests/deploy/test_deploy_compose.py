"""deploy/compose.yaml: valid against the Compose Specification's JSON Schema (vendored,
tests/support/schemas/), and wired as docs/deployment.md says: one-shot topic creation and
migration before the workers, metrics on 0.0.0.0, healthchecks, auth on the API, Prometheus and
Grafana with their files."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest

from tests.support.deploy import DEPLOY, EVERY_INTERFACE, GRAFANA, PROMETHEUS, SCHEMAS, load_yaml

COMPOSE = DEPLOY / "compose.yaml"
WORKERS = {"indexer": "9101", "communities": "9102", "query-api": "8000"}
ONE_SHOT = {"kafka-topics", "migrate"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_compose_file_is_valid_against_the_compose_spec(
    compose: dict[str, Any], validator: jsonschema.Draft202012Validator
) -> None:
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "indexer", "deploy", "replicas"), [2]),
        (("services", "indexer", "depends_on", "migrate", "condition"), "service_finished"),
        (("services", "query-api", "healthcheck", "interval_typo"), "5s"),
    ],
)
def test_the_schema_rejects_a_broken_compose_file(
    compose: dict[str, Any],
    validator: jsonschema.Draft202012Validator,
    path: tuple[str, ...],
    value: object,
) -> None:
    broken = copy.deepcopy(compose)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert not validator.is_valid(broken)


def test_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "kafka", *ONE_SHOT, *WORKERS, "prometheus", "grafana"} <= set(services)
    assert services["postgres"]["image"].startswith("pgvector/pgvector:")
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]


def test_workers_start_after_topics_and_migration(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    for name in WORKERS:
        depends = services[name]["depends_on"]
        for one_shot in ONE_SHOT:
            assert depends[one_shot]["condition"] == "service_completed_successfully", name
        assert services[name]["command"] == ["worker", name]
    for one_shot in ONE_SHOT:
        assert services[one_shot]["restart"] == "no"


def test_indexer_replicas_fit_the_partitions(compose: dict[str, Any]) -> None:
    services = compose["services"]
    script = "\n".join(services["kafka-topics"]["command"])
    partitions = dict(re.findall(r"(kgstream\.[a-z.]+):(\d+)", script))
    documents = int(partitions["kgstream.documents"])
    env = services["indexer"]["environment"]
    assert int(env["KGSTREAM_TOPIC_PARTITIONS"]) == documents
    assert 2 <= services["indexer"]["deploy"]["replicas"] <= documents


def test_workers_listen_on_every_interface_with_healthchecks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    hosts = {
        "indexer": "KGSTREAM_INDEXER_METRICS_HOST",
        "communities": "KGSTREAM_COMMUNITIES_METRICS_HOST",
        "query-api": "KGSTREAM_API_HOST",
    }
    for name, port in WORKERS.items():
        env = services[name]["environment"]
        assert env[hosts[name]] == EVERY_INTERFACE, name
        assert env[hosts[name].removesuffix("HOST") + "PORT"] == port, name
        check = " ".join(services[name]["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/healthz" in check, name
    for name, service in services.items():
        if name not in ONE_SHOT and "profiles" not in service:
            assert "healthcheck" in service, name


def test_the_query_api_requires_keys(compose: dict[str, Any]) -> None:
    api = compose["services"]["query-api"]
    assert api["environment"]["KGSTREAM_AUTH"] == "required"
    # published on the host's loopback only
    assert all(str(p).startswith("127.0.0.1:") for p in api["ports"])
    assert "keys create" in COMPOSE.read_text(encoding="utf-8")


def test_prometheus_and_grafana_mount_files_that_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    volumes = services["prometheus"]["volumes"]
    prometheus_mounts = {v.split(":")[1]: v.split(":")[0] for v in volumes}
    assert prometheus_mounts["/etc/prometheus/prometheus.yml"] == "./prometheus/prometheus.yml"
    assert prometheus_mounts["/etc/prometheus/alerts.yml"] == "./prometheus/alerts.yml"
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), volume
    datasources = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
    providers = load_yaml(GRAFANA / "provisioning" / "dashboards" / "kgstream.yml")
    grafana_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    dashboards_dir = providers["providers"][0]["options"]["path"]
    assert grafana_mounts[dashboards_dir] == "./grafana/dashboards"


def test_prometheus_scrapes_every_worker_by_service_name(compose: dict[str, Any]) -> None:
    config = load_yaml(PROMETHEUS / "prometheus.yml")
    scraped = {
        sd["names"][0]: str(sd["port"])
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
    }
    assert scraped == WORKERS
    assert set(scraped) <= set(compose["services"])
