"""Route kinds: each entity stream is routed to one kind, and each kind is one module here.

``KINDS`` is the registry, in the order the loop applies a poll batch: projections,
then batches, then steps (which park in Redis after PostgreSQL). Adding a kind is one
new module with a route dataclass, a ``parse`` function and an ``Applier``, and one
entry below; the loop, the routes file and the dead-lettering need no change.
"""

from consumer.kinds import batches, projection, steps
from consumer.kinds._barrier import apply_guarded
from consumer.kinds._base import Applier, Kind, Links, Outcome, Refusal, Route
from consumer.kinds._spec import Spec

KINDS: dict[str, Kind] = {k.name: k for k in (projection.KIND, batches.KIND, steps.KIND)}

__all__ = [
    "KINDS",
    "Applier",
    "Kind",
    "Links",
    "Outcome",
    "Refusal",
    "Route",
    "Spec",
    "apply_guarded",
]
