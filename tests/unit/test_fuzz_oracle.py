"""The boundary fuzzer's oracle, worked out apart from the codec, agrees with it input by input."""

from __future__ import annotations

import pickle
import subprocess
import sys

import orjson
import pytest

from schemas import DecodeError, codec, decode, republish
from tests.faults import boundary_inputs, oracle
from tests.faults.mutations import valid_event

STREAMS = {"subscription": "", "seat_ledger": "", "batch": ""}
# What the codec itself refuses (the rest is the routes').
CODEC_REASONS = {
    "empty", "too_large", "invalid_utf8", "not_json", "not_object", "missing_field",
    "wrong_type", "out_of_range", "bad_length", "bad_format", "nul_in_text",
    "lone_surrogate", "too_deep",
}  # fmt: skip


def _codec_disagrees(raw: bytes, expect: oracle.Expect) -> str | None:
    try:
        decode(raw)
    except DecodeError as exc:
        return expect.judge([exc.reason])
    if expect.taken or expect.reasons - CODEC_REASONS:
        return None  # past the codec: the route decides
    return f"expected {expect.label}, the codec took it"


def test_the_codec_refuses_what_the_oracle_expects_for_every_fuzz_input() -> None:
    """3,000 envelopes pushed to the edges: the codec's verdict is one the oracle allows."""
    inputs = boundary_inputs.envelopes(3_000, STREAMS, seed=36)
    wrong = [
        (what, problem)
        for what, raw in inputs
        if (problem := _codec_disagrees(raw, oracle.event(raw))) is not None
    ]
    assert not wrong, f"{len(wrong)} disagree, e.g. {wrong[:5]}"


def test_the_fuzz_inputs_reach_every_kind_of_outcome() -> None:
    """Applied, set aside, refused by the codec and by each route: every one is expected."""
    inputs = boundary_inputs.envelopes(1_000, STREAMS, seed=36)
    labels = {oracle.event(raw, unchanged=w.endswith(": valid")).label for w, raw in inputs}
    for wanted in ("applied", "taken", "batch_rejected", "missing_field", "too_deep"):
        assert wanted in labels, f"no input is expected {wanted}: {sorted(labels)}"


def _doc(**changes: object) -> bytes:
    return orjson.dumps({**codec.to_document(valid_event(1)), **changes})


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        (b"", "empty"),
        (b"[]", "not_object"),
        (b"{", "not_json"),
        (_doc(seq=0), "out_of_range"),
        (_doc(event_type="A"), "bad_format"),
        (_doc(event_type="a.b\n"), "bad_format"),  # ECMA's $ ends the string
        (_doc(entity_id="x" * 257), "bad_length"),
        (_doc(payload={"k": "\x00"}), "nul_in_text"),
        (_doc(payload={"n": 0}).replace(b'"n":0', b'"n":' + b"9" * 400), "not_json"),
        (_doc(payload={"n": 0}).replace(b'"n":0', b'"n":1e400'), "not_json"),
        (_doc(entity_type="nowhere"), "unknown_stream"),
        (_doc(entity_type="batch", event_type="batch.work_item"), "batch_rejected"),
        (_doc(entity_type="batch", event_type="batch.assembled"), "taken"),
    ],
)
def test_the_oracle_names_each_class(raw: bytes, label: str) -> None:
    """Each class of input gets the outcome the contract gives it."""
    assert oracle.event(raw).label == label


def test_the_oracle_fails_a_valid_event_dead_lettered_and_a_bad_one_taken() -> None:
    """The judgement can fail both ways: a letter for the valid, none for the broken."""
    valid = oracle.event(
        _doc(
            entity_type="subscription",
            event_type="subscription.created",
            payload={"plan": "pro", "price_cents": 100, "status": "active"},
        ),
        unchanged=True,
    )
    assert valid.label == "applied"
    assert valid.judge(["projection_rejected"]) is not None
    assert valid.judge([]) is None
    broken = oracle.event(_doc(seq=0))
    assert broken.judge([]) is not None
    assert broken.judge(["bad_length"]) is not None
    assert broken.judge(["out_of_range"]) is None


def test_the_fuzzer_draws_the_same_inputs_whatever_the_process_has_loaded() -> None:
    """Hypothesis draws constants from loaded modules: a drawing interpreter loads none of ours."""
    streams = {"subscription": "", "seat_ledger": "", "batch": ""}
    here = boundary_inputs.envelopes(60, streams, seed=5)
    script = (
        "import pickle, sys, consumer.service, outbox_relay.service\n"
        "from tests.faults import boundary_inputs\n"
        f"made = boundary_inputs.envelopes(60, {streams!r}, seed=5)\n"
        "sys.stdout.buffer.write(pickle.dumps(made))\n"
    )
    elsewhere = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, check=True, cwd=boundary_inputs.ROOT
    )
    assert pickle.loads(elsewhere.stdout) == here  # noqa: S301 - written just above


@pytest.mark.parametrize("name", ["republish_request", "republish_result"])
def test_the_republish_decoders_refuse_exactly_what_the_oracle_calls_invalid(name: str) -> None:
    """2,000 requests or results pushed to the edges: decoded exactly when the oracle says valid."""
    read = republish.decode_request if name == "republish_request" else republish.decode_result
    inputs = boundary_inputs.protocol(name, 2_000, ["sub-000001"], seed=38)
    wrong = []
    for what, raw in inputs:
        try:
            read(raw)
            decoded = True
        except DecodeError:
            decoded = False
        if decoded != oracle.protocol_valid(name, raw):
            wrong.append((what, decoded))
    assert not wrong, f"{len(wrong)} disagree, e.g. {wrong[:5]}"
    assert 0 < sum(oracle.protocol_valid(name, raw) for _, raw in inputs) < len(inputs)
