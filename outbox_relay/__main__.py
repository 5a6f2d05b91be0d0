"""``inorder-relay``: publish the outbox to Kafka, answer republish requests, purge old rows."""

from __future__ import annotations

import sys

from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from schemas import logs
from schemas.config import load_or_exit
from schemas.health import Health, run_until_stopped

PROGRAM = "inorder-relay"


def main(argv: list[str] | None = None) -> None:
    """Run the relay until SIGTERM or SIGINT; exit 0 once in-flight rows are marked."""
    if argv is None:
        argv = sys.argv[1:]
    if argv:
        sys.stderr.write(f"{PROGRAM}: takes no arguments; it is configured by the environment\n")
        raise SystemExit(2)
    settings = load_or_exit(RelaySettings, PROGRAM)
    logs.configure(settings.log_level)
    health = Health()
    relay = Relay(settings, health)
    run_until_stopped(
        PROGRAM, health, settings.http_host, settings.http_port, relay.run, relay.stop
    )


if __name__ == "__main__":
    main()
