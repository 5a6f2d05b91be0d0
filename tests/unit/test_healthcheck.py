"""The image's health check asks the service that runs, at its own port."""

from __future__ import annotations

import pytest

from consumer.settings import ConsumerSettings, SweeperSettings
from outbox_relay.settings import RelaySettings
from schemas.runtime.healthcheck import DEFAULT_PORTS, port

PYTHON = "/opt/inorder/bin/python"


def test_the_default_ports_are_the_services_own() -> None:
    """Each program's default port, as its settings define it."""
    defaults = {
        "inorder-relay": RelaySettings.model_fields["http_port"].default,
        "inorder-consumer": ConsumerSettings.model_fields["http_port"].default,
        "inorder-sweeper": SweeperSettings.model_fields["http_port"].default,
    }
    assert defaults == DEFAULT_PORTS


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([PYTHON, "/opt/inorder/bin/inorder-relay"], {}, 9400),
        ([PYTHON, "/opt/inorder/bin/inorder-sweeper"], {}, 9402),
        (["/opt/inorder/bin/inorder-consumer"], {}, 9401),
        ([PYTHON, "/opt/inorder/bin/inorder-relay"], {"INORDER_HTTP_PORT": "8080"}, 8080),
        ([PYTHON, "/opt/inorder/bin/inorder-admin", "gaps", "list"], {}, None),
        ([PYTHON, "/opt/inorder/bin/inorder-producer", "worker", "w"], {}, None),
    ],
)
def test_the_port_asked_is_the_running_services(
    argv: list[str], env: dict[str, str], expected: int | None
) -> None:
    """The relay's 9400, the sweeper's 9402, a set port wins; a command has none to ask."""
    processes = [["/usr/bin/tini", "--", *argv[:1]], argv, ["sh"]]
    assert port(env, processes) == expected
