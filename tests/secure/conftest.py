"""The secured tests' pipeline fixture."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.security import KafkaNames, kafka_acls
from tests.secure import stack
from tests.secure.pipeline import ROUTES, Run


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    with stack.secured() as secured:
        tag = uuid.uuid4().hex[:8]
        names = KafkaNames(
            events=[f"sec.{tag}.events"],
            dead_letters=f"sec.{tag}.dlq",
            held=f"sec.{tag}.held",
            requests=f"sec.{tag}.requests",
            results=f"sec.{tag}.results",
            consumer_group=f"sec.{tag}.consumer",
            sweeper_group=f"sec.{tag}.sweeper",
            relay_group=f"sec.{tag}.relay",
            outputs=[f"sec.{tag}.batch-output"],
            work=[f"sec.{tag}.batch-work"],
            worker_group=f"sec.{tag}.worker",
        )
        admin = secured.kafka_admin()
        stack.create_topics(
            admin,
            [
                *names.events,
                *names.outputs,
                *names.work,
                names.dead_letters,
                names.held,
                names.requests,
                names.results,
            ],
        )
        bindings = stack.apply_acls(admin, kafka_acls(names))
        routes = tmp_path / "routes.toml"
        routes.write_text(ROUTES.format(output=names.outputs[0], work=names.work[0]))
        found = Run(secured, tmp_path, names, routes)
        try:
            yield found
        finally:
            found.stop()
            stack.delete_acls(admin, bindings)
