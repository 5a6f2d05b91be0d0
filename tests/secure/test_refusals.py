"""On the secured stack: a refused credential, a missing ACL or grant is named, and a
principal without the ACL cannot write a protocol topic."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from psycopg.types.json import Jsonb

from schemas.republish import RepublishResult, encode
from schemas.security import PRODUCER_COLUMNS, Roles, kafka_acls
from tests.secure import stack
from tests.secure.pipeline import Run, owner_prepares, produce
from tests.support.kafka import wait_until

pytestmark = [pytest.mark.secure, pytest.mark.timeout(300)]

WRONG = "wrong-%/#@?-password"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _readyz(port: int) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def _outcome(run: Run, name: str, program: str, principal: str, **env: str) -> tuple[str, str]:
    """Start ``program`` with a credential taken away; ('exit N', its stderr) if it stopped
    within 30 s, else ('unready', the /readyz body) once it says it is not ready."""
    port = _free_port()
    run.start(name, program, principal, INORDER_HTTP_PORT=str(port), **env)
    process = run.processes[name]
    deadline = time.monotonic() + 30
    seen: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (run.tmp / f"{name}.log").read_text()
            return f"exit {process.returncode}", log
        seen = _readyz(port)
        # A dependency named as down; "starting" (with or without its reason) is the
        # service itself, not yet far enough to meet the grant.
        named = seen is not None and any(
            line and line.split(":", 1)[0] != "starting" for line in seen[1].splitlines()
        )
        if seen is not None and seen[0] == 503 and named:
            time.sleep(2)  # let a second try fail the same way
            seen = _readyz(port) or seen
            break
        time.sleep(0.5)
    process.terminate()
    process.wait(30)
    assert seen is not None, f"{name} neither stopped nor answered /readyz"
    return "unready", seen[1]


def _wrong_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    userinfo, _, host = rest.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:{quote(WRONG, safe='')}@{host}"


def _wrong(run: Run, principal: str, service: str) -> dict[str, str]:
    """The principal's settings with the password of ``service`` wrong."""
    env = run.env(principal)
    return {
        "postgres": {"DATABASE_URL": _wrong_url(env["DATABASE_URL"])},
        "redis": {"REDIS_URL": _wrong_url(env.get("REDIS_URL", ""))},
        "kafka": {"INORDER_KAFKA_SASL_PASSWORD": WRONG},
    }[service]


@pytest.fixture
def prepared(run: Run) -> Run:
    owner_prepares(run)
    return run


CASES = [
    ("relay", "inorder-relay", "postgres"),
    ("relay", "inorder-relay", "kafka"),
    ("consumer", "inorder-consumer", "postgres"),
    ("consumer", "inorder-consumer", "redis"),
    ("consumer", "inorder-consumer", "kafka"),
    ("sweeper", "inorder-sweeper", "postgres"),
    ("sweeper", "inorder-sweeper", "redis"),
    ("sweeper", "inorder-sweeper", "kafka"),
]


@pytest.mark.parametrize(("principal", "program", "service"), CASES)
def test_a_refused_password_is_named_in_one_line_or_by_readiness(
    prepared: Run, principal: str, program: str, service: str
) -> None:
    """Wrong password: one line naming the service and exit 2 or 3, or /readyz 503 naming
    it with a code; the password in neither."""
    run = prepared
    wrong = _wrong(run, principal, service)
    how, said = _outcome(run, f"{principal}-{service}", program, principal, **wrong)
    assert WRONG not in said
    assert quote(WRONG, safe="") not in said
    if how == "unready":
        assert f"{service}: " in said, said
        return
    assert how in ("exit 2", "exit 3"), (how, said)
    last = [line for line in said.splitlines() if line.startswith(program)]
    assert len(last) == 1, said
    assert service.replace("postgres", "password") in last[0].lower() or service in last[0].lower()


GRANTS = [
    ("consumer", "inorder-consumer", "inorder_step_progress"),
    ("relay", "inorder-relay", "outbox_relay_slices"),
    ("sweeper", "inorder-sweeper", "inorder_gaps"),
]


@pytest.mark.parametrize(("principal", "program", "table"), GRANTS)
def test_a_missing_grant_stops_a_service_in_one_line_naming_it(
    prepared: Run, principal: str, program: str, table: str
) -> None:
    """A service's role without its grant on a table it needs: exit 3, one line naming it."""
    run = prepared
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {run.secured.schema}")
        conn.execute(f"REVOKE ALL ON {table} FROM inorder_{principal}")
    produce(run)
    if principal != "relay":
        run.start("relay", "inorder-relay", "relay")
    how, said = _outcome(run, principal, program, principal)
    assert how == "exit 3", (how, said)
    [line] = [line for line in said.splitlines() if line.startswith(f"{program}:")]
    assert f"permission denied for table {table}" in line
    assert "Traceback" not in said


COMMAND_GRANTS = [
    ("producer", "inorder-producer", ("batches", "--count", "1"), "INSERT", "outbox"),
    ("admin", "inorder-admin", ("gaps", "list"), "SELECT", "inorder_gaps"),
]


@pytest.mark.parametrize(("principal", "program", "argv", "grant", "table"), COMMAND_GRANTS)
def test_a_missing_grant_stops_a_command_in_one_line_naming_it(
    prepared: Run, principal: str, program: str, argv: tuple[str, ...], grant: str, table: str
) -> None:
    """A command's role without its grant: nonzero, one line naming the table, no traceback."""
    run = prepared
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {run.secured.schema}")
        conn.execute(f"REVOKE {grant} ON {table} FROM inorder_{principal}")
    done = run.run(principal, program, *argv)
    said = done.stdout + done.stderr
    assert done.returncode in (1, 3), said
    assert "Traceback" not in said, said
    [line] = [line for line in done.stderr.splitlines() if line.startswith(f"{program}:")]
    assert f"permission denied for table {table}" in line, line


def test_a_principal_without_the_acl_cannot_write_a_republish_result(prepared: Run) -> None:
    """inorder-producer has no ACL on the results topic: Kafka refuses its forged result."""
    run = prepared
    producer = Producer(run.secured.kafka_config("producer"))
    errors: list[KafkaError] = []
    forged = RepublishResult("gap-1-1-x", "ledger", "e1", 1, 3, 3, (), (3,), (), False)
    producer.produce(
        run.names.results, encode(forged), forged.key, on_delivery=lambda e, _: errors.append(e)
    )
    producer.flush(30)
    assert [e.code() for e in errors if e is not None] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    del producer


def test_an_outbox_row_naming_a_protocol_topic_is_failed_not_sent(prepared: Run) -> None:
    """The relay may write results, but no outbox row makes it: the row fails, none is sent."""
    run = prepared
    forged = RepublishResult("gap-1-1-x", "ledger", "e1", 1, 3, 3, (), (3,), (), False)
    with stack.psycopg.connect(run.secured.database_url("producer")) as conn:
        for topic in (run.names.results, run.names.requests, run.names.events[0]):
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
                "payload) VALUES (%s, 'ledger', 'e1', %s, 'ledger.added', %s, %s)",
                (topic, len(topic), f"forged-{topic}", Jsonb({"raw": encode(forged).decode()})),
            )
        conn.commit()
    run.start("relay", "inorder-relay", "relay")
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {run.secured.schema}")

        def settled() -> list[tuple[str, str | None]]:
            rows = conn.execute(
                "SELECT topic, failure_reason FROM outbox WHERE failed_at IS NOT NULL"
            ).fetchall()
            return rows if len(rows) == 2 else []

        failed = wait_until(settled, timeout_s=60, interval_s=0.5)
    assert {topic for topic, _ in failed} == {run.names.results, run.names.requests}
    assert all("protocol_topic" in (reason or "") for _, reason in failed), failed
    reader = Consumer(
        {**run.secured.kafka_config("super"), "group.id": "probe", "auto.offset.reset": "earliest"}
    )
    try:
        partitions = reader.list_topics(run.names.results, timeout=10).topics[run.names.results]
        ends = [
            reader.get_watermark_offsets(TopicPartition(run.names.results, p), timeout=10)[1]
            for p in partitions.partitions
        ]
    finally:
        reader.close()
    assert ends == [0] * len(ends)


def test_the_grants_are_what_each_role_holds(prepared: Run) -> None:
    """No program may create in the schema; the producer may insert only its columns."""
    run = prepared
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {run.secured.schema}")
        roles = Roles()
        every = [roles.producer, roles.relay, roles.consumer, roles.sweeper, roles.admin]
        rows = conn.execute(
            "SELECT r, has_schema_privilege(r, %s, 'CREATE') FROM unnest(%s::text[]) r",
            (run.secured.schema, every),
        ).fetchall()
        assert not any(creates for _, creates in rows), rows
        columns = dict(
            conn.execute(
                "SELECT column_name, has_column_privilege('inorder_producer', 'outbox', "
                "column_name, 'INSERT') FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = 'outbox'",
                (run.secured.schema,),
            ).fetchall()
        )
    assert {name for name, may in columns.items() if may} == set(PRODUCER_COLUMNS)


ACLS = [
    ("consumer", "inorder-consumer", "group", "group_authorization_failed"),
    ("consumer", "inorder-consumer", "events", "topic_authorization_failed"),
    ("relay", "inorder-relay", "group", "group_authorization_failed"),
    ("relay", "inorder-relay", "requests", "topic_authorization_failed"),
    ("sweeper", "inorder-sweeper", "group", "group_authorization_failed"),
    ("sweeper", "inorder-sweeper", "results", "topic_authorization_failed"),
]


@pytest.mark.parametrize(("principal", "program", "taken", "code"), ACLS)
def test_a_missing_acl_is_named_in_one_line_or_by_readiness(
    prepared: Run, principal: str, program: str, taken: str, code: str
) -> None:
    """A program's group or read ACL taken away: it says so, in one line or on /readyz."""
    run = prepared
    names = run.names
    name = {
        "group": None,
        "events": names.events[0],
        "requests": names.requests,
        "results": names.results,
    }[taken]
    who = getattr(names, principal)
    acls = [
        acl
        for acl in kafka_acls(names)
        if acl.principal == who
        and (acl.resource == "group" if name is None else acl.name == name)
        and (name is None or acl.operation == "read")
    ]
    assert acls
    admin = run.secured.kafka_admin()
    stack.delete_acls(admin, [stack.binding(acl) for acl in acls])
    try:
        how, said = _outcome(run, principal, program, principal)
    finally:
        stack.apply_acls(admin, acls)
    if how == "unready":
        assert f"kafka: {code}" in said, said
        return
    assert how in ("exit 2", "exit 3"), (how, said)
    [line] = [line for line in said.splitlines() if line.startswith(f"{program}:")]
    assert "authorization" in line.lower(), line


def test_a_consumer_before_the_owners_migrations_waits_unready_then_starts_by_itself(
    run: Run,
) -> None:
    """No DDL by a program's role: it waits (postgres: schema_not_ready) until the owner has
    migrated and granted, then starts without a restart."""
    schema = run.secured.schema
    with run.secured.owner() as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO inorder_consumer")
    port = _free_port()
    run.start("consumer", "inorder-consumer", "consumer", INORDER_HTTP_PORT=str(port))
    deadline = time.monotonic() + 60
    seen = None
    while time.monotonic() < deadline and (seen is None or "schema_not_ready" not in seen[1]):
        seen = _readyz(port)
        time.sleep(0.5)
    assert seen is not None
    assert seen[0] == 503
    assert "postgres: schema_not_ready\n" in seen[1], seen
    assert run.processes["consumer"].poll() is None
    owner_prepares(run)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (seen is None or seen[0] != 200):
        seen = _readyz(port)
        time.sleep(1)
    assert seen is not None
    assert seen[0] == 200, seen
    log = (run.tmp / "consumer.log").read_text()
    assert "inorder-consumer migrate" in log


COMMANDS = [
    ("producer", "inorder-producer", ("batches", "--count", "1"), "postgres"),
    ("owner", "inorder-producer", ("migrate",), "postgres"),
    ("owner", "inorder-consumer", ("migrate",), "postgres"),
    ("admin", "inorder-admin", ("audit",), "postgres"),
    ("admin", "inorder-admin", ("parked", "top"), "redis"),
    ("admin", "inorder-admin", ("republish", "ledger:e1", "--from", "1", "--to", "2"), "kafka"),
]


@pytest.mark.parametrize(("principal", "program", "argv", "service"), COMMANDS)
def test_a_command_with_a_refused_password_says_so_in_one_line(
    prepared: Run, principal: str, program: str, argv: tuple[str, ...], service: str
) -> None:
    """Commands run to an end (producer, migrations, admin): one line, nonzero, no password."""
    run = prepared
    done = run.run(principal, program, *argv, **_wrong(run, principal, service))
    said = done.stdout + done.stderr
    assert WRONG not in said
    assert quote(WRONG, safe="") not in said
    assert done.returncode in (1, 2, 3), said
    assert "Traceback" not in said, said
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"{program}:")]
    assert len(lines) == 1, said
    assert "password" in lines[0].lower() or "authentication" in lines[0].lower(), lines[0]


def test_a_share_member_that_may_not_configure_its_group_says_so_in_one_line(
    prepared: Run,
) -> None:
    """Share mode without ALTER_CONFIGS on its group: one line names where the group starts
    and the fix, and the member joins anyway."""
    run = prepared
    port = _free_port()
    run.start(
        "consumer",
        "inorder-consumer",
        "consumer",
        INORDER_HTTP_PORT=str(port),
        INORDER_CONSUMER_MODE="share",
    )
    log = run.tmp / "consumer.log"
    try:
        wait_until(lambda: '"share_group_not_configured"' in log.read_text(), timeout_s=60)
        lines = [
            line for line in log.read_text().splitlines() if "share_group_not_configured" in line
        ]
        assert len(lines) == 1, lines
        assert "share.auto.offset.reset=earliest" in lines[0]
        assert "kafka-configs" in lines[0]
        wait_until(lambda: (_readyz(port) or (0, ""))[0] == 200, timeout_s=60)
        status = _readyz(port)
        assert status is not None
        assert "share group" in status[1], status
    finally:
        run.stop()


WRITES = [
    ("ledger", "ledger.added"),  # another stream's events
    ("ledger", "ledger.snapshot"),  # a snapshot: a baseline route's entities moved on
    ("batch", "batch.accepted"),  # any batch's manifest
]


def test_a_worker_writing_another_streams_events_or_a_snapshot_is_refused_naming_the_grant(
    prepared: Run,
) -> None:
    """The worker's principal writes its results, and nothing else: one line names the pair."""
    run = prepared
    with stack.psycopg.connect(run.secured.database_url("worker")) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
            "payload) VALUES (%s, 'batch_result', 'b#1', 1, 'batch.item_failed', 'r1', '{}')",
            (run.names.events[0],),
        )
        conn.commit()
        for entity_type, event_type in WRITES:
            with pytest.raises(stack.psycopg.errors.InsufficientPrivilege) as refused:
                conn.execute(
                    "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, "
                    "event_id, payload) VALUES (%s, %s, 'e1', 9, %s, %s, '{}')",
                    (run.names.events[0], entity_type, event_type, f"forged-{event_type}"),
                )
            conn.rollback()
            assert refused.value.diag.message_primary == (
                f"role inorder_worker may not write {event_type} events of entity type "
                f"{entity_type} to the outbox"
            )
    done = run.run("worker", "inorder-producer", "batches", "--count", "1")
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "Traceback" not in said, said
    [line] = [line for line in done.stderr.splitlines() if line.startswith("inorder-producer:")]
    assert "may not write batch.accepted events of entity type batch" in line, line
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {run.secured.schema}")
        kinds = conn.execute("SELECT entity_type, event_type FROM outbox").fetchall()
    assert kinds == [("batch_result", "batch.item_failed")]
