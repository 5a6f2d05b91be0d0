"""The image, run for real: migrate, relay, consumer and sweeper as containers on the local stack.

Run by `make test-image` after `make image` (pytest marker ``image``). Containers use the
host network, run with a read-only root filesystem as the image's user, and must answer
their probes from inside and outside, apply a burst of events end to end, and exit 0 on
SIGTERM within 5 seconds.
"""

from __future__ import annotations

import base64
import json
import os
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumer import examples
from producer import migrate, subscriptions
from tests.conftest import PgSchema, TopicFactory
from tests.image.engine import IMAGE, Engine, find_engine
from tests.integration.relay_support import free_port
from tests.support.kafka import wait_until
from tests.support.services import ROOT, Services

pytestmark = pytest.mark.image

ENTITIES = 40
K8S = ROOT / "deploy" / "k8s"

# What the TLS Secret holds in the kube play test (the relay only has to be able to read it).
CA_TEXT = "-----BEGIN CERTIFICATE-----\nnot a real certificate\n-----END CERTIFICATE-----"


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """The container engine; without one the tests skip, saying why (in CI they fail)."""
    command, why = find_engine()
    if command is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a container runtime for the image tests: {why}")
        pytest.skip(f"no container runtime can be had here: {why}")
    found = Engine(command, [])
    if not found.run("images", "-q", IMAGE):
        pytest.fail(f"no image {IMAGE}: run `make image` first")
    try:
        yield found
    finally:
        found.remove_all()


def _http(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return int(answer.status)
    except OSError:
        return 0


def _inside(engine: Engine, name: str, port: int, path: str) -> str:
    """What the probe answers when asked from inside the container."""
    script = (
        "import urllib.request as u; "
        f"print(u.urlopen('http://127.0.0.1:{port}{path}', timeout=2).status)"
    )
    return engine.run("exec", name, "python", "-c", script)


def test_relay_consumer_and_sweeper_containers_apply_a_burst_and_stop_cleanly(
    engine: Engine,
    services: Services,
    pg_schema: PgSchema,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    """Migrate, then relay, consumer and sweeper containers: events applied, probes, SIGTERM."""
    events, tag = topic_factory("events"), uuid.uuid4().hex[:8]
    routes = tmp_path / "routes.toml"
    routes.write_text(examples.PROJECTION_ROUTE + examples.STEP_ROUTE)
    routes.chmod(0o644)
    common = {
        "DATABASE_URL": pg_schema.url,
        "KAFKA_BOOTSTRAP_SERVERS": services.kafka_bootstrap,
        "REDIS_URL": services.redis_url,
        "INORDER_ROUTES_FILE": "/etc/inorder/routes.toml",
        "INORDER_TOPICS": f'["{events}"]',
        "INORDER_GROUP_ID": f"img-{tag}",
        "INORDER_SWEEPER_GROUP_ID": f"img-{tag}-sweeper",
        "INORDER_RELAY_GROUP_ID": f"img-{tag}-relay",
        "INORDER_REPUBLISH_REQUESTS_TOPIC": topic_factory("requests"),
        "INORDER_REPUBLISH_RESULTS_TOPIC": topic_factory("results"),
        "INORDER_DEAD_LETTER_TOPIC": topic_factory("dlq"),
        "INORDER_HELD_TOPIC": topic_factory("held"),
        "INORDER_REDIS_KEY_PREFIX": f"img{tag}",
    }
    engine.run(
        "run", "--rm", "--network", "host", "--read-only", "-e", f"DATABASE_URL={pg_schema.url}",
        IMAGE, "inorder-producer", "migrate", "--example",
    )  # fmt: skip
    with pg_schema.connect(autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('outbox') IS NOT NULL").fetchone() == (True,)
        conn.execute(examples.BILLING_VIEW)
        conn.execute(examples.SEAT_TABLES)
    ports = {"relay": free_port(), "consumer": free_port(), "sweeper": free_port()}
    mount = (f"{routes}:/etc/inorder/routes.toml:ro",)
    for process, port in ports.items():
        env = {**common, "INORDER_HTTP_PORT": str(port), "INORDER_HTTP_HOST": "127.0.0.1"}
        engine.start(f"inorder-{process}-{tag}", env, f"inorder-{process}", volumes=mount)
    for process, port in ports.items():
        wait_until(lambda port=port: _http(port, "/readyz") == 200, timeout_s=60)
        name = f"inorder-{process}-{tag}"
        assert _http(port, "/healthz") == 200
        assert _inside(engine, name, port, "/healthz") == "200"
        assert _inside(engine, name, port, "/readyz") == "200"
        assert engine.run("exec", name, "inorder-healthcheck") == ""  # exit 0: healthy
        assert engine.run("exec", name, "id", "-u") == "10001"
        status = engine.run("exec", name, "cat", "/proc/1/status")
        assert "\nUid:\t10001\t" in status, f"{process} does not run as uid 10001"
        denied = engine.run("exec", name, "touch", "/opt/inorder/written", check=False)
        assert denied == ""  # nothing printed on stdout; the write itself must fail:
        assert (
            engine.run("exec", name, "test", "!", "-e", "/opt/inorder/written", check=False) == ""
        )
    with pg_schema.connect() as conn:
        for n in range(ENTITIES):
            subscriptions.create_subscription(conn, f"img-{n}", "basic", 2, topic=events)
            subscriptions.add_seats(conn, f"img-{n}", 3, topic=events)
            subscriptions.change_plan(conn, f"img-{n}", "pro", topic=events)
    with pg_schema.connect() as conn:
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FILTER (WHERE plan = 'pro') FROM billing_view"
                ).fetchone()
                == (ENTITIES,)
            ),
            timeout_s=90,
        )
        wait_until(
            lambda: (
                conn.execute("SELECT count(*), sum(seats) FROM seat_totals").fetchone()
                == (ENTITIES, 5 * ENTITIES)
            ),
            timeout_s=90,
        )
    for process in ("sweeper", "consumer", "relay"):
        code, took = engine.stop(f"inorder-{process}-{tag}")
        print(f"image: {process} container: SIGTERM to exit {code} in {took:.1f} s")
        # Exit 0, not 137: it stopped on SIGTERM before the engine's SIGKILL.
        assert (process, code) == (process, 0)


def _deployment_for_host_network(source: Path, port: int) -> dict[str, Any]:
    """The base's Deployment as ``podman kube play`` can run it on the host network.

    On the host network a pod cannot map ports, and replicas would share one port, so
    the container's port list goes (probes name the port by number instead) and one
    replica runs; everything else is the manifest as shipped.
    """
    deployment = next(
        d for d in yaml.safe_load_all(source.read_text()) if d["kind"] == "Deployment"
    )
    deployment["spec"]["replicas"] = 1
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    container["image"] = IMAGE
    container.pop("ports")
    for probe in ("livenessProbe", "readinessProbe"):
        container[probe]["httpGet"]["port"] = port
    container["env"] = [
        {"name": "INORDER_HTTP_PORT", "value": str(port)} if e["name"] == "INORDER_HTTP_PORT" else e
        for e in container["env"]
    ]
    return deployment


def _config_map(folder: Path, name: str, data: dict[str, str]) -> Path:
    """A ConfigMap file for ``podman kube play --configmap``."""
    path = folder / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        )
    )
    return path


def test_the_relay_deployment_runs_under_podman_kube_play(
    engine: Engine, services: Services, pg_schema: PgSchema, tmp_path: Path
) -> None:
    """deploy/k8s/relay.yaml, played by podman with its ConfigMaps and Secret, becomes ready."""
    if engine.command != "podman":
        pytest.skip("podman kube play needs podman; this machine builds with docker")
    tag, port = uuid.uuid4().hex[:8], free_port()
    with pg_schema.connect(autocommit=True) as conn:
        migrate.apply(conn)
    manifest = tmp_path / "relay.yaml"
    manifest.write_text(yaml.safe_dump(_deployment_for_host_network(K8S / "relay.yaml", port)))
    settings = _config_map(
        tmp_path,
        "inorder-settings",
        {
            "KAFKA_BOOTSTRAP_SERVERS": services.kafka_bootstrap,
            "INORDER_HTTP_HOST": "127.0.0.1",
            "INORDER_RELAY_GROUP_ID": f"kube-{tag}",
            "INORDER_CREATE_TOPICS": "false",
            "INORDER_PAYLOAD_SCHEMAS": "/etc/inorder-event-schemas",
        },
    )
    # The mounted schema folder holds one type of the operator's own: read at start-up.
    schemas = _config_map(
        tmp_path, "inorder-event-schemas", {"order.created.schema.json": '{"type": "object"}'}
    )
    # podman keeps a Secret's keys as JSON of base64 values, the form a Secret's data has.
    secret = tmp_path / "secret.json"
    secret.write_text(
        json.dumps({"database-url": base64.b64encode(pg_schema.url.encode()).decode()})
    )
    engine.run("secret", "rm", "inorder-secrets", check=False)  # one left by a killed run
    engine.run("secret", "create", "inorder-secrets", str(secret))
    # The TLS files' Secret (a CA here): mounted read-only, readable by the pod's group.
    # Made even though the volume is optional: podman before 4.4 reads `optional: true`
    # backwards (containers/podman#16636), failing without the Secret and skipping the
    # mount with it; from 4.4 the file is there, and checked.
    tls = tmp_path / "tls.json"
    tls.write_text(json.dumps({"ca.pem": base64.b64encode(CA_TEXT.encode()).decode()}))
    engine.run("secret", "rm", "inorder-tls", check=False)
    engine.run("secret", "create", "inorder-tls", str(tls))
    try:
        engine.run("kube", "down", str(manifest), check=False)  # a pod left by a killed run
        engine.run(
            "kube",
            "play",
            "--network",
            "host",
            "--configmap",
            str(settings),
            "--configmap",
            str(schemas),
            str(manifest),
        )
        try:
            wait_until(lambda: _http(port, "/readyz") == 200, timeout_s=60)
            assert _http(port, "/healthz") == 200
            if _podman_version(engine) >= (4, 4):
                [relay] = [
                    name
                    for name in engine.run("ps", "--format", "{{.Names}}").split()
                    if "relay" in name and "infra" not in name
                ]
                assert engine.run("exec", relay, "cat", "/etc/inorder-tls/ca.pem") == CA_TEXT
        finally:
            engine.run("kube", "down", str(manifest), check=False)
    finally:
        engine.run("secret", "rm", "inorder-secrets", check=False)
        engine.run("secret", "rm", "inorder-tls", check=False)


def _podman_version(engine: Engine) -> tuple[int, ...]:
    """podman's version as numbers (4, 3, 1)."""
    text = engine.run("version", "--format", "{{.Client.Version}}")
    return tuple(int(part) for part in text.split("-")[0].split(".") if part.isdigit())


def test_the_image_names_its_version_and_its_base_by_digest(engine: Engine) -> None:
    """OCI labels: the project's version, the base image's name and digest; a version tag."""
    raw = engine.run("image", "inspect", IMAGE, "--format", "{{json .Config.Labels}}")
    labels = json.loads(raw) or {}
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.base.name"]
    assert labels["org.opencontainers.image.base.digest"].startswith("sha256:")
    tagged = engine.run("image", "inspect", f"inorder:{version}", "--format", "{{.Id}}")
    assert tagged == engine.run("image", "inspect", IMAGE, "--format", "{{.Id}}")
