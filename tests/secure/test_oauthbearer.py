"""OAUTHBEARER against a real broker: programs log in to Kafka with OIDC client credentials.

The secured stack's issuer signs a token for each program's client id and secret; the
broker's OAUTHBEARER listener checks it against the issuer's key set, and the token's
subject is the principal the ACLs name, as with SCRAM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.secure.pipeline import ENTITIES, SEQS, Run, owner_prepares, produce
from tests.secure.test_refusals import WRONG, _outcome
from tests.support.kafka import wait_until

pytestmark = [pytest.mark.secure, pytest.mark.timeout(300)]


def _applied(run: Run) -> int:
    with run.secured.owner() as conn:
        conn.execute(f"SET search_path = {run.secured.schema}")
        row = conn.execute("SELECT count(*) FROM applied_steps").fetchone()
        return int(row[0]) if row else 0


def test_the_relay_and_consumer_log_in_with_oidc_tokens_and_the_acls_hold(run: Run) -> None:
    """Client credentials buy tokens; the events flow through the OAUTHBEARER listener."""
    owner_prepares(run)
    produce(run)
    run.oauth = True
    run.start("relay", "inorder-relay", "relay")
    run.start("consumer", "inorder-consumer", "consumer")
    wait_until(lambda: _applied(run) == ENTITIES * SEQS, timeout_s=120, interval_s=1)
    codes = run.stop()
    assert codes == {"relay": 0, "consumer": 0}, codes
    tokens = (
        Path(run.secured.env["INORDER_SECURE_CA"]).parents[1] / "oidc" / "oidc.log"
    ).read_text()
    assert "token for inorder-relay" in tokens
    assert "token for inorder-consumer" in tokens


def test_a_refused_client_secret_is_named_and_never_printed(run: Run) -> None:
    """The issuer refuses the consumer's secret: one line or /readyz names Kafka; no secret."""
    owner_prepares(run)
    run.oauth = True
    secret = run.secured.kafka_oauth("consumer", secret=WRONG)["INORDER_KAFKA_OAUTH_CLIENT_SECRET"]
    how, said = _outcome(
        run, "consumer", "inorder-consumer", "consumer", INORDER_KAFKA_OAUTH_CLIENT_SECRET=secret
    )
    assert WRONG not in said
    if how == "unready":
        assert "kafka: " in said, said
        return
    assert how in ("exit 2", "exit 3"), (how, said)
