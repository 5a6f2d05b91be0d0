"""Trace context from the writer's span to the projection, against real PostgreSQL and Kafka."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from opentelemetry import trace
from opentelemetry.instrumentation.confluent_kafka import ConfluentKafkaInstrumentor
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.trace import SpanKind
from prometheus_client import REGISTRY
from prometheus_client.openmetrics import exposition as openmetrics

from producer import OutboxEvent, emit
from schemas import PayloadSchemas, encode, tracing
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration import step_handlers
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support import otlp, traces
from tests.support.kafka import drain, wait_until
from tests.support.services import Services


def _emit_in_a_span(outbox: PgSchema, topic: str, entities: list[str]) -> trace.SpanContext:
    """Write one event per entity in one transaction, inside a span; that span's context."""
    tracer = trace.get_tracer("checkout-service")
    with tracer.start_as_current_span("checkout") as span, outbox.connect() as conn:
        with conn.transaction():
            for entity in entities:
                event = OutboxEvent(
                    "subscription", entity, 1, "subscription.plan_changed", rs.PAYLOAD, topic=topic
                )
                emit(conn, event)
        return span.get_span_context()


def test_the_writer_s_span_is_linked_from_the_relay_s_and_the_consumer_s(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """Emit in a span: the row and message carry it; the relay's and consumer's spans link it."""
    entities = ["t1", "t2", "t3"]
    cs.create_view(outbox)
    routes = tmp_path / "routes.toml"
    routes.write_text(cs.ROUTES)
    dlq = f"{topics.events}.dlq"
    relay = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    consumer = cs.settings_for(outbox, services.kafka_bootstrap, routes, topics.events, dlq)
    with traces.recording() as spans:
        origin = _emit_in_a_span(outbox, topics.events, entities)
        with outbox.connect() as conn:
            rows = conn.execute("SELECT headers->>'traceparent' FROM outbox ORDER BY id").fetchall()
        traceparent = f"00-{origin.trace_id:032x}-{origin.span_id:016x}-{origin.trace_flags:02x}"
        assert [r[0] for r in rows] == [traceparent] * 3
        with rs.running(relay):
            wait_until(lambda: rs.unsent(outbox) == 0)
        messages = drain(services.kafka_bootstrap, topics.events, expect=3)
        assert {dict(m.headers() or [])["traceparent"] for m in messages} == {traceparent.encode()}
        with cs.running(consumer):
            wait_until(lambda: len(cs.view(outbox)) == 3)
        finished = spans.get_finished_spans()
    [publish] = [s for s in traces.named(finished, "publish ") if traces.linked_to(s, origin)]
    assert publish.kind is SpanKind.PRODUCER
    assert publish.attributes["messaging.destination.name"] == topics.events
    assert publish.attributes["messaging.batch.message_count"] == 3
    linked = traces.linked_to(publish, origin)
    assert sorted(link.attributes["inorder.entity"] for link in linked) == [
        f"subscription:{e}" for e in entities
    ]
    assert all(link.attributes["inorder.xid"] > 0 for link in linked)
    processed = [s for s in traces.named(finished, "process ") if traces.linked_to(s, origin)]
    assert processed, "no consumer span links to the writer's span"
    assert all(s.kind is SpanKind.CONSUMER for s in processed)
    links = [link for s in processed for link in traces.linked_to(s, origin)]
    assert sorted(link.attributes["inorder.event_id"] for link in links) == [
        f"subscription:{e}:1:1" for e in entities
    ]
    assert sum(s.attributes["inorder.applied"] for s in processed) == 3
    # Links, never parents: each program's span starts its own trace.
    assert all(s.parent is None for s in [publish, *processed])
    # The latency histograms name traces (exemplars, in OpenMetrics): the writer's for the
    # apply latency, the delivery's for the relay's.
    exposed = openmetrics.generate_latest(REGISTRY).decode()
    applied = [line for line in exposed.splitlines() if line.startswith("event_apply_latency")]
    assert any(f'trace_id="{origin.trace_id:032x}"' in line for line in applied)
    published = [line for line in exposed.splitlines() if line.startswith("outbox_publish_latency")]
    assert any(f'trace_id="{publish.context.trace_id:032x}"' in line for line in published)


def test_without_a_tracer_provider_rows_get_no_trace_headers_and_no_span_is_made(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics
) -> None:
    """The API installed but no provider set: the row's headers stay as the writer gave them."""
    with outbox.connect() as conn, conn.transaction():
        emit(conn, OutboxEvent("subscription", "n1", 1, "subscription.plan_changed", rs.PAYLOAD))
    with outbox.connect() as conn:
        assert conn.execute("SELECT headers FROM outbox").fetchone() == ({},)


NOT_INSTALLED = """
import sys

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("not installed")
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
import psycopg
from producer import OutboxEvent, emit
from schemas import PayloadSchemas, encode, tracing
from schemas import tracing
import outbox_relay.publisher, consumer.service  # the programs' modules import fine
assert not tracing.INSTALLED and not tracing.active()
with psycopg.connect(sys.argv[1]) as conn:
    with conn.transaction():
        emit(conn, OutboxEvent("subscription", "x1", 1, "subscription.plan_changed", {PAYLOAD!r}))
    assert conn.execute("SELECT headers FROM outbox").fetchone() == ({{}},)
assert not [m for m in sys.modules if m.startswith("opentelemetry")], "imported"
print("ok")
"""


def test_without_the_extra_nothing_is_imported_and_rows_are_written_as_before(
    outbox: PgSchema,
) -> None:
    """opentelemetry not importable: emit and the programs' modules work, and import none of it."""
    script = NOT_INSTALLED.replace("{PAYLOAD!r}", repr(rs.PAYLOAD)).replace("{{}}", "{}")
    url = outbox.url
    done = subprocess.run(
        [sys.executable, "-c", script, url], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


def _links_to(span: Any, origin: trace.SpanContext) -> list[Any]:
    """The links of an exported span that point at ``origin``."""
    trace_id, span_id = origin.trace_id.to_bytes(16, "big"), origin.span_id.to_bytes(8, "big")
    return [link for link in span.links if (link.trace_id, link.span_id) == (trace_id, span_id)]


def test_the_programs_export_their_spans_over_otlp_to_a_receiver(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT set: relay and consumer export spans linked to the writer."""
    cs.create_view(outbox)
    routes = tmp_path / "routes.toml"
    routes.write_text(cs.ROUTES)
    relay = rs.settings_for(outbox, services.kafka_bootstrap, topics, http_port=rs.free_port())
    consumer = cs.settings_for(
        outbox,
        services.kafka_bootstrap,
        routes,
        topics.events,
        f"{topics.events}.dlq",
        http_port=rs.free_port(),
    )
    with traces.recording(), otlp.receiving() as receiver:
        origin = _emit_in_a_span(outbox, topics.events, ["o1", "o2"])
        exporting = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        processes = [
            rs.spawn({**rs.relay_env(relay), **exporting}, tmp_path / "relay.log"),
            cs.spawn({**cs.consumer_env(consumer), **exporting}, tmp_path / "consumer.log"),
        ]
        try:
            wait_until(lambda: len(cs.view(outbox)) == 2, timeout_s=60)
            wait_until(
                lambda: any(_links_to(s, origin) for s in receiver.of("inorder-relay", "publish ")),
                timeout_s=30,
            )
            wait_until(
                lambda: any(
                    _links_to(s, origin) for s in receiver.of("inorder-consumer", "process ")
                ),
                timeout_s=30,
            )
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=30)
    [publish] = [s for s in receiver.of("inorder-relay", "publish ") if _links_to(s, origin)]
    assert publish.kind == publish.SPAN_KIND_PRODUCER
    entities = sorted(
        a.value.string_value
        for link in _links_to(publish, origin)
        for a in link.attributes
        if a.key == "inorder.entity"
    )
    assert entities == ["subscription:o1", "subscription:o2"]
    processed = [s for s in receiver.of("inorder-consumer", "process ") if _links_to(s, origin)]
    assert all(s.kind == s.SPAN_KIND_CONSUMER for s in processed)


def test_an_event_parked_behind_its_predecessor_has_a_park_span_and_its_apply_is_linked(
    outbox: PgSchema,
    services: Services,
    topics: rs.RelayTopics,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Seq 2 written in a span, relayed, parked; seq 1 comes: a park span and the apply link it."""
    ss.prepare(outbox)
    schemas = PayloadSchemas.configured(rs.TEST_SCHEMAS, allow_unknown=False)
    tracer = trace.get_tracer("ledger-service")
    routes = tmp_path / "routes.toml"
    routes.write_text(ss.routes_text())
    relay = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    consumer = cs.parking_settings_for(
        outbox, services, routes, topics.events, f"{topics.events}.dlq", redis_prefix
    )

    def write(seq: int) -> trace.SpanContext:
        with tracer.start_as_current_span(f"add {seq}") as span, outbox.connect() as conn:
            with conn.transaction():
                event = OutboxEvent("ledger", "w", seq, "ledger.added", {}, topic=topics.events)
                emit(conn, event, schemas=schemas)
            return span.get_span_context()

    with traces.recording() as spans, rs.running(relay), cs.running(consumer):
        second = write(2)
        wait_until(lambda: ss.progress(outbox, "w") is not None)  # parked: its row is made
        parked_at = time.time()
        first = write(1)
        wait_until(lambda: ss.applied(outbox, "w") == [(1, 1), (1, 2)])
        finished = spans.get_finished_spans()
    assert any(traces.linked_to(s, second) for s in traces.named(finished, "publish "))
    [park] = [s for s in traces.named(finished, "park") if traces.linked_to(s, second)]
    assert park.attributes["inorder.seq"] == 2
    assert park.attributes["inorder.reorder_distance"] == 1
    assert park.attributes["inorder.route"] == "ledger"
    assert park.start_time is not None
    assert park.end_time is not None
    assert park.start_time <= parked_at * 1e9 <= park.end_time
    [applying] = [s for s in traces.named(finished, "process ") if traces.linked_to(s, first)]
    [link] = traces.linked_to(applying, second)  # the drained event, linked at its apply
    assert link.attributes["inorder.entity"] == "ledger:w"
    assert applying.attributes["inorder.applied"] == 2
    # inorder-admin explain names the trace each outbox row was written in.
    told = sw.run_tool("inorder-admin", cs.consumer_env(consumer), "--json", "explain", "ledger:w")
    assert told.returncode == 0, told.stderr
    for context in (first, second):
        assert f'"trace_id":"{context.trace_id:032x}"' in told.stdout


def test_a_review_span_covers_the_stop_and_the_step_applied_after_links_to_it(
    outbox: PgSchema,
    services: Services,
    topics: rs.RelayTopics,
    tmp_path: Path,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step fails and stops; inorder-admin review retry exports a review span from the stop."""
    ss.prepare(outbox)
    flag = tmp_path / "refuse"
    flag.touch()
    monkeypatch.setenv("INORDER_TEST_FAIL_FLAG", str(flag))
    routes = tmp_path / "routes.toml"
    routes.write_text(ss.routes_text("fail_while_flagged"))
    relay = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    consumer = cs.parking_settings_for(
        outbox, services, routes, topics.events, f"{topics.events}.dlq", redis_prefix
    )
    schemas = PayloadSchemas.configured(rs.TEST_SCHEMAS, allow_unknown=False)
    with traces.recording(), otlp.receiving() as receiver:
        with rs.running(relay), cs.running(consumer):
            with trace.get_tracer("ledger-service").start_as_current_span("add") as span:
                with outbox.connect() as conn, conn.transaction():
                    event = OutboxEvent("ledger", "w", 1, "ledger.added", {}, topic=topics.events)
                    emit(conn, event, schemas=schemas)
                origin = span.get_span_context()
            wait_until(lambda: (ss.progress(outbox, "w") or (0,) * 5)[3] == 1)
        stopped_by = time.time()
        flag.unlink()
        env = {
            **cs.consumer_env(consumer),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "INORDER_TEST_FAIL_FLAG": str(flag),
            "PYTHONPATH": str(sw.ROOT),  # the test's step functions
        }
        told = sw.run_tool("inorder-admin", env, "review", "retry", "ledger:w", "--run-handlers")
        assert told.returncode == 0, told.stderr
        assert ss.applied(outbox, "w") == [(1, 1)]
        wait_until(lambda: receiver.of("inorder-admin", "review"))
    [review] = receiver.of("inorder-admin", "review")
    about = {a.key: a.value for a in review.attributes}
    assert about["inorder.decision"].string_value == "retried"
    assert about["inorder.seq"].int_value == 1
    assert review.start_time_unix_nano <= stopped_by * 1e9 < review.end_time_unix_nano
    assert _links_to(review, origin)  # the stopped step, drained and applied in the review
    assert any(_links_to(s, origin) for s in receiver.of("inorder-admin", "park"))


def test_a_healed_gap_has_a_span_linked_to_the_republish_request_and_the_relay_s_answer(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """A row the cursor passed: the sweeper asks, the relay answers, the gap's span links both."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    sw.write_with_a_lost_row(p, range(1, 6), lost=3)
    with traces.recording() as spans, sw.running(p):
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["healed"], timeout_s=60)
        finished = spans.get_finished_spans()
    requests = traces.named(finished, f"republish {p.topics.requests}")
    answers = traces.named(finished, "republish answer")
    assert requests
    assert answers
    assert requests[0].kind is SpanKind.PRODUCER
    assert all(any(traces.linked_to(a, r.context) for r in requests) for a in answers)
    [gap] = traces.named(finished, "gap")
    assert (gap.attributes["inorder.gap.from_seq"], gap.attributes["inorder.gap.to_seq"]) == (3, 3)
    assert any(traces.linked_to(gap, r.context) for r in requests)
    assert any(traces.linked_to(gap, a.context) for a in answers)
    assert gap.start_time is not None
    assert gap.end_time is not None
    assert gap.end_time - gap.start_time > 0


def test_psycopg_s_own_instrumentation_puts_the_projection_s_statements_under_the_batch_span(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """With opentelemetry-instrumentation-psycopg on, the writes to the view nest in the span."""
    cs.create_view(outbox)
    routes = tmp_path / "routes.toml"
    routes.write_text(cs.ROUTES)
    dlq = f"{topics.events}.dlq"
    relay = rs.settings_for(outbox, services.kafka_bootstrap, topics)
    consumer = cs.settings_for(outbox, services.kafka_bootstrap, routes, topics.events, dlq)
    instrumentor = PsycopgInstrumentor()
    with traces.recording() as spans:
        instrumentor.instrument()
        try:
            origin = _emit_in_a_span(outbox, topics.events, ["p1", "p2"])
            with rs.running(relay):
                wait_until(lambda: rs.unsent(outbox) == 0)
            with cs.running(consumer):
                wait_until(lambda: len(cs.view(outbox)) == 2)
        finally:
            instrumentor.uninstrument()
        finished = spans.get_finished_spans()
    applying = {
        s.context.span_id for s in traces.named(finished, "process ") if traces.linked_to(s, origin)
    }
    nested = [s for s in finished if s.parent is not None and s.parent.span_id in applying]
    statements = " ".join(str(s.attributes.get("db.statement", s.name)) for s in nested)
    assert "billing_view" in statements, statements


def test_the_sweeper_exports_its_request_and_gap_spans_over_otlp(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """inorder-sweeper with OTEL_EXPORTER_OTLP_ENDPOINT: its republish and gap spans arrive."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    with otlp.receiving() as receiver:
        env = {**sw.env(p), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        env["OTEL_BSP_SCHEDULE_DELAY"] = "200"
        with (tmp_path / "sweeper.log").open("ab") as sink:
            sweeper = subprocess.Popen(
                [sw.tool("inorder-sweeper")], env=env, stdout=sink, stderr=sink
            )
        try:
            sw.write_with_a_lost_row(p, range(1, 6), lost=3)
            with sw.running(p, sweeper=False):
                wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["healed"], timeout_s=60)
            wait_until(lambda: receiver.of("inorder-sweeper", "gap"), timeout_s=30)
        finally:
            sweeper.send_signal(signal.SIGTERM)
            assert sweeper.wait(timeout=60) == 0
    [gap] = receiver.of("inorder-sweeper", "gap")
    requests = receiver.of("inorder-sweeper", f"republish {p.topics.requests}")
    assert requests
    assert requests[0].kind == requests[0].SPAN_KIND_PRODUCER
    linked = {(link.trace_id, link.span_id) for link in gap.links}
    assert any((r.trace_id, r.span_id) in linked for r in requests)


def test_a_kafka_client_instrumentation_s_own_context_does_not_replace_the_writer_s(
    outbox: PgSchema, services: Services, topics: rs.RelayTopics, tmp_path: Path
) -> None:
    """A producer instrumented by opentelemetry's confluent-kafka package adds its own
    traceparent after the row's: the consumer still links the writer's span."""
    cs.create_view(outbox)
    routes = tmp_path / "routes.toml"
    routes.write_text(cs.ROUTES)
    dlq = f"{topics.events}.dlq"
    consumer = cs.settings_for(outbox, services.kafka_bootstrap, routes, topics.events, dlq)
    with traces.recording() as spans:
        with trace.get_tracer("billing").start_as_current_span("change plan") as writing:
            origin = writing.get_span_context()
            row_headers = [(k, v.encode()) for k, v in tracing.carried({}).items()]
        producer = ConfluentKafkaInstrumentor.instrument_producer(
            Producer({"bootstrap.servers": services.kafka_bootstrap})
        )
        event = cs.plan_event("k1", 1)
        producer.produce(
            topic=topics.events, value=encode(event), key=event.key, headers=list(row_headers)
        )
        producer.flush(10)
        [message] = drain(services.kafka_bootstrap, topics.events, expect=1)
        parents = [v for k, v in message.headers() or [] if k == "traceparent"]
        assert len(parents) == 2  # the row's, then the instrumentation's send span's
        with cs.running(consumer):
            wait_until(lambda: len(cs.view(outbox)) == 1)
        finished = spans.get_finished_spans()
    [sent] = [s for s in finished if s.kind is SpanKind.PRODUCER]  # the instrumentation's
    [applying] = traces.named(finished, "process ")
    assert traces.linked_to(applying, origin)
    assert not traces.linked_to(applying, sent.context)


def test_each_retry_of_a_failed_step_has_a_retry_span(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """A step timing out twice: the sweeper's two retries each make a span naming the entity."""
    step_handlers.FLAKY.clear()
    routes = (
        f'[[route]]\nstream = "{ss.STREAM}"\nkind = "step"\n'
        '[route.handlers."ledger.added"]\n'
        'function = "tests.integration.step_handlers:flaky_at_3"\n'
        '[route.handlers."ledger.added".retry]\nbackoff_s = 0.2\n'
    )
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix, routes_text=routes)
    sw.write_outbox(p, range(1, 5))
    with traces.recording() as spans, sw.running(p):
        wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 4, timeout_s=60)
        finished = spans.get_finished_spans()
    retries = [s for s in traces.named(finished, "retry") if s.name == "retry"]
    assert len(retries) == 2
    assert {s.attributes["inorder.entity"] for s in retries} == {"ledger:a"}
