"""The Kafka clients every program makes, made one way.

A client's configuration is built in layers, each winning over the one before: the
tunables the program chose (``INORDER_KAFKA_EXTRA`` may change them), the cluster settings
(addresses, security, ``INORDER_KAFKA_EXTRA``), what the program fixed for its own use, and
last what inorder relies on, which nothing changes: every producer is idempotent with
``acks=all``, and every consumer commits its offsets itself and starts a new group at the
earliest offset, so no event is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from schemas.runtime import kafka_watch
from schemas.runtime.kafka_settings import KafkaClientSettings

PRODUCER_GUARANTEES: Mapping[str, Any] = {"enable.idempotence": True, "acks": "all"}
CONSUMER_GUARANTEES: Mapping[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
}


def _layered(
    settings: KafkaClientSettings,
    tunables: Mapping[str, Any] | None,
    fixed: Mapping[str, Any] | None,
    own: Mapping[str, Any],
) -> dict[str, Any]:
    """The layers in order, each winning over the one before; ``own`` last of all.

    Every client reports librdkafka's errors to ``kafka_watch`` (a refused login shows on
    ``/readyz``), before any error callback of the program's own.
    """
    config = {**(tunables or {}), **settings.kafka_config(), **(fixed or {}), **own}
    given = config.get("error_cb")

    def on_error(err: KafkaError) -> None:
        kafka_watch.report(err)
        if given is not None:
            given(err)

    config["error_cb"] = on_error
    return config


def producer_config(
    settings: KafkaClientSettings,
    client_id: str,
    *,
    tunables: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A producer's configuration: idempotent, ``acks=all``, named ``client_id``."""
    return _layered(settings, tunables, fixed, {"client.id": client_id, **PRODUCER_GUARANTEES})


def consumer_config(
    settings: KafkaClientSettings,
    client_id: str,
    group_id: str,
    *,
    tunables: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A consumer's configuration in group ``group_id``: offsets committed by the program."""
    own = {"client.id": client_id, "group.id": group_id, **CONSUMER_GUARANTEES}
    return _layered(settings, tunables, fixed, own)


def producer(
    settings: KafkaClientSettings,
    client_id: str,
    *,
    tunables: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> Producer:
    """An idempotent, ``acks=all`` producer (see ``producer_config``)."""
    return Producer(producer_config(settings, client_id, tunables=tunables, fixed=fixed))


def consumer(
    settings: KafkaClientSettings,
    client_id: str,
    group_id: str,
    *,
    tunables: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> Consumer:
    """A consumer that commits its own offsets (see ``consumer_config``)."""
    return Consumer(consumer_config(settings, client_id, group_id, tunables=tunables, fixed=fixed))
