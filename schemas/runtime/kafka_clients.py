"""The Kafka clients every program makes, made one way.

A client's configuration is built in layers, each winning over the one before: the
tunables the program chose (``INORDER_KAFKA_EXTRA`` may change them), the cluster settings
(addresses, security, ``INORDER_KAFKA_EXTRA``), what the program fixed for its own use, and
last what inorder relies on, which nothing changes: every producer is idempotent with
``acks=all``, and every consumer commits its offsets itself and starts a new group at the
earliest offset, so no event is skipped. A consumer joins its group by the group
protocol the settings name (``group_config``). A configuration librdkafka refuses is the
operator's to fix: ``ClientConfigError``, one line at start-up, never an outage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, ShareConsumer

from schemas.errors import OperatorError
from schemas.runtime import kafka_watch
from schemas.runtime.kafka_settings import KafkaClientSettings


class ClientConfigError(OperatorError):
    """Raised when librdkafka refuses a client's configuration (a property it does not take)."""


@contextmanager
def _refusals() -> Iterator[None]:
    """Turn librdkafka's refusal of a configuration into ``ClientConfigError`` (one line)."""
    try:
        yield
    except (ValueError, TypeError) as exc:  # the share consumer says it so
        raise ClientConfigError(
            f"Kafka client configuration refused: {str(exc).splitlines()[0]} "
            "(check INORDER_KAFKA_EXTRA)"
        ) from None
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError._INVALID_ARG:
            raise ClientConfigError(
                f"Kafka client configuration refused: {err.str()} "
                "(check INORDER_KAFKA_EXTRA and INORDER_KAFKA_GROUP_PROTOCOL)"
            ) from None
        raise


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
    assignor: str | None = None,
) -> dict[str, Any]:
    """A consumer's configuration in group ``group_id``: offsets committed by the program.

    ``assignor`` is the client-side assignor under the classic group protocol; under the
    consumer protocol the broker assigns (``INORDER_KAFKA_GROUP_REMOTE_ASSIGNOR``).
    """
    group = settings.group_config(assignor)
    own = {"client.id": client_id, "group.id": group_id, **CONSUMER_GUARANTEES}
    return _layered(settings, tunables, {**(fixed or {}), **group}, own)


def admin_config(settings: KafkaClientSettings, client_id: str) -> dict[str, Any]:
    """An admin client's configuration, named ``client_id``."""
    return _layered(settings, None, None, {"client.id": client_id})


def producer(
    settings: KafkaClientSettings,
    client_id: str,
    *,
    tunables: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> Producer:
    """An idempotent, ``acks=all`` producer (see ``producer_config``)."""
    config = producer_config(settings, client_id, tunables=tunables, fixed=fixed)
    with _refusals():
        return Producer(config)


def consumer(
    settings: KafkaClientSettings,
    client_id: str,
    group_id: str,
    *,
    tunables: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
    assignor: str | None = None,
) -> Consumer:
    """A consumer that commits its own offsets (see ``consumer_config``)."""
    config = consumer_config(
        settings, client_id, group_id, tunables=tunables, fixed=fixed, assignor=assignor
    )
    with _refusals():
        return Consumer(config)


def share_consumer(
    settings: KafkaClientSettings,
    client_id: str,
    group_id: str,
    *,
    fixed: Mapping[str, Any] | None = None,
) -> ShareConsumer:
    """A member of share group ``group_id`` that acknowledges each record itself.

    A share group has no offsets to reset and no assignor: where it starts is the
    group's ``share.auto.offset.reset``, set through the admin API.
    """
    own = {
        "client.id": client_id,
        "group.id": group_id,
        "share.acknowledgement.mode": "explicit",
    }
    with _refusals():
        return ShareConsumer(_layered(settings, None, fixed, own))
