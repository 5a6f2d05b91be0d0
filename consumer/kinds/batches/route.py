"""A ``batch`` route: reassemble a batch's results in position order.

It takes the stream's ``batch.accepted`` events and the workers' results, whose
entity_type is the stream's name plus ``_result``::

    [[route]]
    stream = "batch"                 # results arrive as entity_type "batch_result"
    kind = "batch"
    output_topic = "inorder.batch.output"   # batch.assembled, via the consumer's outbox
    work_topic = "inorder.batch.work"       # where failed positions are dispatched again
    max_retries = 2                  # automatic re-dispatches of a certain failure
    deadline_s = 3600                # unless the batch sets its own
    on_incomplete = "hold"           # or "assemble_incomplete" (the default)
    max_early_results = 10000        # results kept before their batch's manifest comes
    early_results_ttl_s = 86400      # then dead-lettered by the sweeper
"""

from __future__ import annotations

from dataclasses import dataclass, field

from consumer.kinds._spec import Spec, default, names, setting
from schemas import DEFAULT_TOPICS, batches
from schemas.batches import OnIncomplete

# So that "<stream>_result" and "<stream>_item" stay within a 63-character entity_type.
MAX_STREAM = 56


@dataclass(frozen=True, slots=True)
class BatchRoute:
    """Batch reassembly: a manifest per batch, results by position, output in position order."""

    stream: str
    output_topic: str = setting(
        "Where assembled batches (`batch.assembled`) go, through the consumer's own outbox",
        DEFAULT_TOPICS.batch_output,
    )
    work_topic: str = setting(
        "Where failed positions are dispatched again as work items", DEFAULT_TOPICS.batch_work
    )
    max_retries: int = setting("Automatic re-dispatches of a position whose failure is certain", 0)
    deadline_s: int = setting("How long a batch may wait for results, unless it sets its own", 3600)
    on_incomplete: str = setting(
        "At the deadline with positions missing: `assemble_incomplete` (listing them) or "
        "`hold` for a person",
        OnIncomplete.ASSEMBLE_INCOMPLETE.value,
    )
    max_early_results: int = setting(
        "Results of batches whose manifest has not come yet that the route keeps; past it "
        "(or past `max_early_bytes`) a result is dead-lettered `batch_rejected`",
        10_000,
    )
    max_early_bytes: int = setting(
        "Bytes of such results the route keeps (their messages as they arrived)", 64 * 2**20
    )
    early_results_ttl_s: int = setting(
        "How long such a result is kept; then the sweeper dead-letters it `batch_rejected`",
        86_400,
    )
    kind: str = field(default="batch", init=False)

    @property
    def result_stream(self) -> str:
        """The entity stream the workers' results arrive in."""
        return batches.result_stream(self.stream)

    @property
    def streams(self) -> tuple[str, ...]:
        """Every entity stream this route takes: its own and its results'."""
        return (self.stream, self.result_stream)

    @property
    def topics(self) -> tuple[str, ...]:
        """Where assembled output and re-dispatched work items go."""
        return (self.output_topic, self.work_topic)


def parse(spec: Spec) -> BatchRoute:
    """A batch route from its ``[[route]]`` table; problems go to ``spec``."""
    spec.only("batch", names(BatchRoute))
    retries = spec.values.get("max_retries", default(BatchRoute, "max_retries"))
    if type(retries) is not int or retries < 0:
        spec.problem(f"max_retries must be a whole number >= 0, got {retries!r}")
        retries = default(BatchRoute, "max_retries")
    if len(spec.stream) > MAX_STREAM:
        spec.problem(f"a batch stream name must be at most {MAX_STREAM} characters")
    return BatchRoute(
        stream=spec.stream,
        output_topic=spec.topic("output_topic", BatchRoute),
        work_topic=spec.topic("work_topic", BatchRoute),
        max_retries=retries,
        deadline_s=spec.positive("deadline_s", BatchRoute),
        on_incomplete=spec.choice("on_incomplete", tuple(OnIncomplete), BatchRoute),
        max_early_results=spec.positive("max_early_results", BatchRoute),
        max_early_bytes=spec.positive("max_early_bytes", BatchRoute),
        early_results_ttl_s=spec.positive("early_results_ttl_s", BatchRoute),
    )
