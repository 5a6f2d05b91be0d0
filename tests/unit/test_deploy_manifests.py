"""The image, compose file and Kubernetes base use only real commands, ports, probes, settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from consumer.settings import ConsumerSettings, SweeperSettings
from outbox_relay.settings import RelaySettings
from producer.settings import ProducerSettings
from producer.worker import WorkerSettings
from tests.support.services import ROOT

DEPLOY = ROOT / "deploy"
SCRIPTS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
SETTINGS: dict[str, type[BaseSettings]] = {
    "inorder-relay": RelaySettings,
    "inorder-consumer": ConsumerSettings,
    "inorder-sweeper": SweeperSettings,
    "inorder-producer": ProducerSettings,
}
PROBES = {"/healthz", "/readyz"}


def env_names(model: type[BaseSettings]) -> set[str]:
    """Every environment variable a settings class reads."""
    prefix = str(model.model_config.get("env_prefix", ""))
    names = set()
    for name, info in model.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(c) for c in alias.choices)
        else:
            names.add(f"{prefix}{name}".upper())
    return names


def _settings_for(command: list[str]) -> set[str]:
    if command[:2] == ["inorder-producer", "worker"]:
        return env_names(WorkerSettings)
    return env_names(SETTINGS[command[0]])


def test_env_names_come_from_the_settings() -> None:
    """The settings reader knows the aliases and the INORDER_ prefix."""
    names = env_names(ConsumerSettings)
    assert {"DATABASE_URL", "REDIS_URL", "INORDER_ROUTES_FILE", "INORDER_HTTP_PORT"} <= names


def test_dockerfile_is_multistage_non_root_with_tini_and_a_healthcheck() -> None:
    """The image: two stages, project-only install, non-root, tini as PID 1, a health check."""
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    assert sum(line.startswith("FROM ") for line in lines) >= 2
    assert any("pip install --no-deps --no-build-isolation ." in line for line in lines)
    assert not any("[test]" in line for line in lines)
    user = next(line for line in reversed(lines) if line.startswith("USER "))
    assert user.split()[1].split(":")[0] not in ("root", "0")
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in lines
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".stack", "tests", ".git"} <= set(ignored)


def _rendered(where: Path | None = None) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is missing: `make test` installs kubernetes-client")
    done = subprocess.run(
        [kubectl, "kustomize", str(where or DEPLOY / "k8s")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_kustomize_renders_deployments_that_match_the_code() -> None:
    """Each Deployment runs a console script, probes its own endpoints, reads known settings."""
    objects = _rendered()
    kinds = {o["kind"] for o in objects}
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",
        "ScaledObject",
        "ServiceMonitor",
        "PrometheusRule",
    } <= kinds
    assert "Secret" not in kinds  # referenced, never inlined
    config = next(o for o in objects if o["metadata"]["name"].startswith("inorder-settings"))
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {
        "inorder-relay",
        "inorder-consumer",
        "inorder-sweeper",
    }
    read_by_some: set[str] = set()
    for deployment in deployments:
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        [container] = spec["containers"]
        assert container["image"].split(":")[0] == "inorder"
        assert container["command"][0] in SCRIPTS
        env = {e["name"]: e for e in container["env"]}
        known = _settings_for(container["command"])
        assert set(env) <= known
        read_by_some |= known
        port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
        assert int(env["INORDER_HTTP_PORT"]["value"]) == port
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["path"] in PROBES
            assert container[probe]["httpGet"]["port"] == "http"
        assert all("secretKeyRef" in e["valueFrom"] for e in env.values() if "valueFrom" in e)
        assert spec["terminationGracePeriodSeconds"] >= 30
    # The shared settings ConfigMap holds nothing that no process reads.
    assert set(config["data"]) <= read_by_some


def test_keda_caps_consumers_at_the_partition_count() -> None:
    """The consumer scales on its group's lag, at most one replica per partition."""
    [scaled] = [o for o in _rendered() if o["kind"] == "ScaledObject"]
    default_partitions = ConsumerSettings.model_fields["topic_partitions"].default
    assert scaled["spec"]["maxReplicaCount"] == default_partitions
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["metadata"]["consumerGroup"] == ConsumerSettings.model_fields["group_id"].default


def test_prometheus_rule_is_the_rules_file() -> None:
    """The PrometheusRule carries exactly the groups of deploy/prometheus/rules.yml."""
    [rule] = [o for o in _rendered() if o["kind"] == "PrometheusRule"]
    groups = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())["groups"]
    assert rule["spec"]["groups"] == groups


def test_compose_services_match_the_settings_and_scrape_config() -> None:
    """Every inorder service runs a real script with known settings; Prometheus scrapes its port."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert compose["redis"]["command"][1:3] == ["--appendonly", "yes"]
    assert compose["consumer"]["deploy"]["replicas"] == 2
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = str(scrape["scrape_configs"])
    for name, service in compose.items():
        command = service.get("command", [])
        if service.get("image", "").split(":")[0] != "inorder" or command[0] == "sh":
            continue
        assert command[0] in SCRIPTS, name
        assert set(service["environment"]) <= _settings_for(command), name
        port = service["environment"].get("INORDER_HTTP_PORT")
        if port is not None:
            assert f"{name}:{port}" in targets or (
                f"'{name}'" in targets and f"'port': {port}" in targets
            ), name
    for name in ("relay", "consumer", "sweeper", "prometheus", "grafana", "loadgen", "kafka"):
        assert name in compose


# Pod Security Standards, "restricted" (Kubernetes 1.30): the volume types it allows.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _restricted_problems(pod: dict[str, Any]) -> list[str]:
    """What in one pod spec the "restricted" profile refuses; empty when it passes."""
    problems = [flag for flag in ("hostNetwork", "hostPID", "hostIPC") if pod.get(flag)]
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {kinds}")
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        problems += _container_problems(container, pod.get("securityContext", {}))
    return problems


def _container_problems(c: dict[str, Any], pod_context: dict[str, Any]) -> list[str]:
    context = c.get("securityContext", {})
    caps = context.get("capabilities", {})
    seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
    found = {
        "privileged": bool(context.get("privileged")),
        "allowPrivilegeEscalation not false": context.get("allowPrivilegeEscalation") is not False,
        "capabilities not dropped": "ALL" not in caps.get("drop", []),
        "capabilities added": bool(set(caps.get("add", [])) - {"NET_BIND_SERVICE"}),
        "may run as root": not (context.get("runAsNonRoot") or pod_context.get("runAsNonRoot")),
        "runs as uid 0": 0 in (context.get("runAsUser"), pod_context.get("runAsUser")),
        "no seccomp profile": seccomp.get("type") not in ("RuntimeDefault", "Localhost"),
        "hostPort": any(p.get("hostPort") for p in c.get("ports", [])),
    }
    return [f"{c['name']}: {what}" for what, bad in found.items() if bad]


def test_every_pod_passes_the_restricted_pod_security_profile() -> None:
    """Deployments and the migration Job: non-root, no capabilities, seccomp, no token."""
    pods = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in _rendered()
        if o["kind"] in ("Deployment", "Job")
    }
    assert set(pods) == {"inorder-relay", "inorder-consumer", "inorder-sweeper", "inorder-migrate"}
    for name, pod in pods.items():
        assert _restricted_problems(pod) == [], name
        assert pod["automountServiceAccountToken"] is False, name


def test_the_restricted_check_refuses_what_the_profile_refuses() -> None:
    """The check itself: a privileged, root, capability-adding pod fails on each count."""
    bad = {
        "hostNetwork": True,
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        "containers": [
            {
                "name": "c",
                "ports": [{"containerPort": 80, "hostPort": 80}],
                "securityContext": {
                    "privileged": True,
                    "runAsUser": 0,
                    "capabilities": {"add": ["SYS_ADMIN"]},
                },
            }
        ],
    }
    assert {p.split(": ", 1)[-1] for p in _restricted_problems(bad)} == {
        "hostNetwork",
        "{'hostPath'}",
        "privileged",
        "allowPrivilegeEscalation not false",
        "capabilities not dropped",
        "capabilities added",
        "may run as root",
        "runs as uid 0",
        "no seccomp profile",
        "hostPort",
    }


def test_only_prometheus_gets_in_and_only_the_services_ports_get_out() -> None:
    """The NetworkPolicy selects every inorder pod, both directions."""
    [policy] = [o for o in _rendered() if o["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/part-of": "inorder"}
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    [rule] = spec["ingress"]
    [source] = rule["from"]
    assert source["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert source["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }  # a prometheus-labelled pod of any other namespace stays out
    ports = {p["port"] for r in spec["egress"] for p in r["ports"]}
    assert ports == {53, 5432, 6379, 9092, 9093}
    [dns] = [r for r in spec["egress"] if {p["port"] for p in r["ports"]} == {53}]
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    job = next(o for o in _rendered() if o["kind"] == "Job")
    commands = [
        c["command"]
        for c in (
            *job["spec"]["template"]["spec"]["initContainers"],
            *job["spec"]["template"]["spec"]["containers"],
        )
    ]
    assert commands == [["inorder-producer", "migrate"], ["inorder-consumer", "migrate"]]


@pytest.mark.parametrize(("component", "port"), [("oauth-token-endpoint", 443), ("otlp", 4318)])
def test_each_documented_feature_has_a_component_opening_its_egress(
    component: str, port: int, tmp_path: Path
) -> None:
    """OAUTHBEARER's token endpoint and OTLP export: an overlay adds one component each."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(DEPLOY / "k8s", overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{base}]\ncomponents: [{base}/components/{component}]\n"
    )
    policies = [o for o in _rendered(overlay) if o["kind"] == "NetworkPolicy"]
    assert len(policies) == 2
    [opened] = [p for p in policies if p["metadata"]["name"] != "inorder"]
    [rule] = opened["spec"]["egress"]
    assert [p["port"] for p in rule["ports"]] == [port]
    assert rule["to"]  # a named peer, never any address
    assert opened["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/part-of": "inorder"}


def test_images_are_tagged_with_the_projects_version() -> None:
    """Kubernetes and compose run the version built, never `latest`."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    images = {
        c["image"]
        for o in _rendered()
        if o["kind"] in ("Deployment", "Job")
        for c in (
            *o["spec"]["template"]["spec"].get("initContainers", []),
            *o["spec"]["template"]["spec"]["containers"],
        )
    }
    assert images == {f"inorder:{version}"}
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    ours = {
        s["image"] for s in compose["services"].values() if s.get("image", "").startswith("inorder")
    }
    assert ours == {f"inorder:{version}"}


def test_every_pod_mounts_the_tls_secret_read_only_for_its_group_only() -> None:
    """CA and client key files reach every container from a Secret, never world-readable."""
    pods = [
        o["spec"]["template"]["spec"] for o in _rendered() if o["kind"] in ("Deployment", "Job")
    ]
    for pod in pods:
        [tls] = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert tls["secret"]["secretName"] == "inorder-tls"
        assert tls["secret"]["optional"] is True
        assert tls["secret"]["defaultMode"] & 0o007 == 0  # nothing for others
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
        for container in (*pod.get("initContainers", []), *pod["containers"]):
            [mount] = [m for m in container["volumeMounts"] if m["name"] == "tls"]
            assert mount == {"name": "tls", "mountPath": "/etc/inorder-tls", "readOnly": True}
