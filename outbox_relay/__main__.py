"""``inorder-relay``: publish the outbox to Kafka, answer republish requests, purge old rows."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import structlog

from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from schemas import logs
from schemas.config import load_or_exit
from schemas.health import Health, serve

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
    try:
        server = serve(health, settings.http_host, settings.http_port)
    except OSError as exc:
        sys.stderr.write(
            f"{PROGRAM}: cannot serve health and metrics on "
            f"{settings.http_host}:{settings.http_port} ({exc.strerror}); set INORDER_HTTP_PORT\n"
        )
        raise SystemExit(2) from None
    relay = Relay(settings, health)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        structlog.get_logger(__name__).info("relay_stopping", signal=signal.Signals(signum).name)
        relay.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    structlog.get_logger(__name__).info(
        "http_serving", host=settings.http_host, port=server.server_address[1]
    )
    relay.run()
    server.shutdown()


if __name__ == "__main__":
    main()
