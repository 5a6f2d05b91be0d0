"""``inorder-relay``: publish the outbox to Kafka, answer republish requests, purge old rows."""

from __future__ import annotations

from outbox_relay.errors import UnsafeClusterError
from outbox_relay.foreign_table import ForeignTableError
from outbox_relay.republish_only import RepublishOnly
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from schemas.errors import TopicSettingsError
from schemas.runtime import logs
from schemas.runtime.config import load_or_exit
from schemas.runtime.health import Health
from schemas.runtime.payloads import registry_or_exit
from schemas.runtime.process import arguments, fail, serve

PROGRAM = "inorder-relay"
SUMMARY = (
    "Publishes the outbox table to Kafka in each entity's seq order, re-sends a range of "
    "an entity's rows when a republish request asks, and deletes sent rows past their "
    "retention. Run two or more: they share the outbox's slices. With "
    "INORDER_RELAY_ROLE=republish_only it only answers republish requests, from a Debezium "
    "outbox table."
)


def main(argv: list[str] | None = None) -> None:
    """Run the relay until SIGTERM or SIGINT; exit 0 once the batch in hand is settled."""
    arguments(PROGRAM, argv, SUMMARY, RelaySettings)
    settings = load_or_exit(RelaySettings, PROGRAM)
    schemas = registry_or_exit(settings, PROGRAM)
    logs.configure(settings.log_level, settings.cautions())
    health = Health()
    relay: Relay | RepublishOnly
    if settings.relay_role == "republish_only":
        relay = RepublishOnly(settings, health)
    else:
        relay = Relay(settings, health, schemas=schemas)

    def run() -> None:
        try:
            relay.run()
        except (UnsafeClusterError, TopicSettingsError, ForeignTableError) as exc:
            fail(PROGRAM, [str(exc)])

    serve(PROGRAM, health, settings.http_host, settings.http_port, relay, run)


if __name__ == "__main__":
    main()
