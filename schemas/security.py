"""Least privilege: what each program may do in PostgreSQL and in Kafka, as data.

One role (PostgreSQL) and one principal (Kafka) per program. The owner runs the
migrations and owns every table; each program is granted what its work needs, and no
program may create anything:

- producer: INSERT into the outbox's own columns (never ``id``, ``xid``, the relay's
  bookkeeping or ``failed_at``), and reading and answering snapshot requests;
- relay: reading and marking outbox rows, its cursors, slices, leases and re-sends;
- consumer and sweeper: reading and writing the consumer's tables and the projection
  tables they are routed to; the sweeper also asks for snapshots;
- admin: what the sweeper may, and reading the outbox and the relay's tables (``explain``,
  ``audit``);
- with batch routes, the consumer, sweeper and admin also write to the outbox (assembled
  batches and re-dispatched work items go out through it, in the decision's
  transaction), and each worker inserts its results into the outbox as a producer does.

Which rows each writer may insert is narrower than the table's grant: the outbox lets a
role that is not its owner insert only the ``(entity_type, event_type)`` pairs listed
for it in ``outbox_writers`` (``outbox_writes``): the producer its own streams (their
snapshots included: it answers snapshot requests), batch manifests and work items; a
worker only results; the consumers only assembled batches and re-dispatched work items.
Runtime roles read the migrations ledger and never write it.

``postgres_grants`` gives the GRANT statements and the writers' rows, ``kafka_acls`` the
ACL bindings; the deploy README shows them and the secured tests apply them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from schemas.batches import (
    ACCEPTED,
    ASSEMBLED,
    FAILED,
    SUCCEEDED,
    WORK_ITEM,
    item_stream,
    result_stream,
)
from schemas.outbox.events import COLUMNS

# The outbox's columns a producer writes (every writer's); the rest are the database's
# or the relay's.
PRODUCER_COLUMNS = COLUMNS
RELAY_TABLES = ("outbox_relays", "outbox_relay_slices", "outbox_resend")
CONSUMER_TABLES = (
    "inorder_step_progress",
    "inorder_step_log",
    "inorder_step_attempts",
    "inorder_step_failures",
    "inorder_step_skips",
    "inorder_gaps",
    "inorder_dead_letters",
    "inorder_dead_letter_decisions",
    "inorder_held_events",
    "inorder_batches",
    "inorder_batch_items",
    "inorder_batch_early_results",
    "inorder_batch_actions",
    "inorder_step_wakes",
)
DML = "SELECT, INSERT, UPDATE, DELETE"
LEDGER = "inorder_migrations"  # every migration set's ledger: the owner's alone to write
ANY = "*"  # in ``outbox_writers``: any entity type, or any event type


@dataclass(frozen=True, slots=True)
class Roles:
    """The PostgreSQL role of each program."""

    producer: str = "inorder_producer"
    relay: str = "inorder_relay"
    consumer: str = "inorder_consumer"
    sweeper: str = "inorder_sweeper"
    admin: str = "inorder_admin"
    worker: str = "inorder_worker"


@dataclass(frozen=True, slots=True)
class Write:
    """``role`` may insert outbox rows of ``entity_type`` with ``event_type`` (``*``: any)."""

    role: str
    entity_type: str
    event_type: str = ANY


def outbox_writes(
    roles: Roles, streams: Sequence[str] = (ANY,), batch_streams: Sequence[str] = ()
) -> list[Write]:
    """The ``outbox_writers`` rows of each program.

    ``streams``: the entity types the producer writes (every event type of each, its
    snapshots included). ``batch_streams``: the batch routes' streams; the producer
    writes their manifests and work items, a worker their results, the consumers their
    assembled revisions and re-dispatched work items.
    """
    writes = [Write(roles.producer, stream) for stream in streams]
    consumers = (roles.consumer, roles.sweeper, roles.admin)
    for stream in batch_streams:
        items, results = item_stream(stream), result_stream(stream)
        writes += [Write(roles.producer, stream, ACCEPTED), Write(roles.producer, items, WORK_ITEM)]
        writes += [Write(roles.worker, results, kind) for kind in (SUCCEEDED, FAILED)]
        for role in consumers:
            writes += [Write(role, stream, ASSEMBLED), Write(role, items, WORK_ITEM)]
    return list(dict.fromkeys(writes))


def postgres_grants(
    roles: Roles,
    schema: str,
    projections: Sequence[str] = (),
    *,
    streams: Sequence[str] = (ANY,),
    batch_streams: Sequence[str] = (),
) -> list[str]:
    """The GRANT statements, in ``schema``, for tables the owner's migrations made, and
    the ``outbox_writers`` rows that say which streams each writer may insert.

    ``projections``: the tables the routes project into (the consumer writes them).
    ``streams``: the producer's entity types. ``batch_streams``: the batch routes'
    streams; with any, the consumer, sweeper and admin write their output to the outbox,
    and the workers (``roles.worker``) write their results.
    """
    batches = bool(batch_streams)
    consumers = f"{roles.consumer}, {roles.sweeper}, {roles.admin}"
    workers = (roles.worker,) if batches else ()
    everyone = ", ".join((roles.producer, roles.relay, consumers, *workers))
    inserts = ", ".join((roles.producer, consumers, *workers) if batches else (roles.producer,))
    writes = outbox_writes(roles, streams, batch_streams)
    return [
        f"GRANT USAGE ON SCHEMA {schema} TO {everyone}",
        f"GRANT INSERT ({', '.join(PRODUCER_COLUMNS)}) ON {schema}.outbox TO {inserts}",
        f"GRANT USAGE ON SEQUENCE {schema}.outbox_id_seq TO {inserts}",
        f"GRANT SELECT, UPDATE ON {schema}.outbox_snapshot_requests TO {roles.producer}",
        f"GRANT SELECT ON {schema}.outbox_writers TO {inserts}",
        *(  # statements for the owner to run, shown in the README; values quoted as literals
            f"INSERT INTO {schema}.outbox_writers (role, entity_type, event_type) VALUES "  # noqa: S608
            f"({sql.quote(w.role)}, {sql.quote(w.entity_type)}, {sql.quote(w.event_type)}) "
            "ON CONFLICT DO NOTHING"
            for w in writes
        ),
        f"GRANT SELECT ON {schema}.{LEDGER} TO {everyone}",
        f"GRANT SELECT, UPDATE, DELETE ON {schema}.outbox TO {roles.relay}",
        *(f"GRANT {DML} ON {schema}.{table} TO {roles.relay}" for table in RELAY_TABLES),
        f"GRANT SELECT ON {schema}.outbox TO {roles.admin}",
        *(  # a consumer with a batch route looks for a relay on its outbox at start
            (f"GRANT SELECT ON {schema}.outbox_relay_slices TO {roles.consumer}",)
            if batches
            else ()
        ),
        *(f"GRANT SELECT ON {schema}.{table} TO {roles.admin}" for table in RELAY_TABLES),
        f"GRANT INSERT, SELECT ON {schema}.outbox_snapshot_requests TO {roles.sweeper}, "
        f"{roles.admin}",
        # the sweeper checks the relays' retention against its routes' parks
        f"GRANT SELECT ON {schema}.outbox_relays TO {roles.sweeper}",
        *(f"GRANT {DML} ON {schema}.{table} TO {consumers}" for table in CONSUMER_TABLES),
        *(f"GRANT {DML} ON {schema}.{table} TO {consumers}" for table in projections),
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {consumers}",
    ]


@dataclass(frozen=True, slots=True)
class Acl:
    """One Kafka ACL binding: ``principal`` may ``operation`` on ``resource`` ``name``."""

    principal: str
    resource: str  # topic, group, cluster
    name: str
    operation: str  # read, write, describe, describe_configs, idempotent_write
    prefixed: bool = False


@dataclass(frozen=True, slots=True)
class KafkaNames:
    """The topics and groups of one deployment, and the principal of each program."""

    events: Sequence[str]
    dead_letters: str
    held: str
    requests: str
    results: str
    consumer_group: str
    sweeper_group: str
    relay_group: str
    # Batch routes: the topics their assembled output goes to (read downstream, not by
    # inorder) and their work topics (read by the workers, in worker_group).
    outputs: Sequence[str] = ()
    work: Sequence[str] = ()
    worker_group: str = "inorder-worker"
    admin_group_prefix: str = "inorder-admin-"
    relay: str = "User:inorder-relay"
    consumer: str = "User:inorder-consumer"
    sweeper: str = "User:inorder-sweeper"
    admin: str = "User:inorder-admin"
    worker: str = "User:inorder-worker"


def kafka_acls(names: KafkaNames) -> list[Acl]:
    """Each program's ACLs: what it reads and writes, and the groups it joins.

    Writing a topic includes describing it; the idempotent producers need
    ``idempotent_write`` on the cluster. Nobody may create topics: the owner does. The
    relay writes every topic an outbox row may name: the events, batch outputs and work
    items. Workers only read work items: their results go through the outbox.
    """
    acls: list[Acl] = []

    def may(principal: str, operation: str, *topics: str) -> None:
        for topic in topics:
            acls.append(Acl(principal, "topic", topic, operation))
            acls.append(Acl(principal, "topic", topic, "describe"))

    def joins(principal: str, group: str, *, prefixed: bool = False) -> None:
        acls.append(Acl(principal, "group", group, "read", prefixed))

    may(names.relay, "write", *names.events, *names.outputs, *names.work, names.results)
    may(names.relay, "read", names.requests)
    joins(names.relay, names.relay_group)
    may(names.consumer, "read", *names.events)
    may(names.consumer, "write", names.dead_letters, names.held)
    joins(names.consumer, names.consumer_group)
    may(names.sweeper, "read", names.results)
    may(names.sweeper, "write", names.requests, names.dead_letters)
    joins(names.sweeper, names.sweeper_group)
    may(names.admin, "read", names.dead_letters, names.held)
    may(names.admin, "write", names.requests, *names.events)
    joins(names.admin, names.admin_group_prefix, prefixed=True)
    if names.work:
        may(names.worker, "read", *names.work)
        joins(names.worker, names.worker_group)
    for principal in (names.relay, names.consumer, names.sweeper, names.admin):
        acls.append(Acl(principal, "cluster", "kafka-cluster", "idempotent_write"))
    return sorted(set(acls), key=lambda a: (a.principal, a.resource, a.name, a.operation))
