"""Route kinds: each entity stream is routed to one kind, and each kind is one module here.

``KINDS`` is the registry, in the order the loop applies a poll batch: projections,
then batches, then steps (which park in Redis after PostgreSQL). Adding a kind is one
new module (or package) with a route dataclass, a ``parse`` function and an
``Applier``, and one entry below; the loop, the routes file and the dead-lettering
need no change. A kind that has periodic work, an operator's view or commands of its
own adds its ``Duties``, ``Inspector`` and ``Commands`` to its ``Kind``: the sweeper,
``explain``, ``audit``, ``republish`` and ``inorder-admin`` then take it in with no
change either.
"""

from consumer.kinds import batches, projection, steps
from consumer.kinds._arrivals import Arrivals
from consumer.kinds._barrier import apply_guarded
from consumer.kinds._base import Applier, Kind
from consumer.kinds._connections import connections_problem
from consumer.kinds._outcome import Carried, Outcome, Refusal, Tally
from consumer.kinds._plugin import (
    AdminTools,
    Answered,
    Commands,
    Duties,
    Findings,
    Inspector,
    SweepReport,
)
from consumer.kinds._resources import Resources
from consumer.kinds._route import Route
from consumer.kinds._spec import Spec

KINDS: dict[str, Kind] = {k.name: k for k in (projection.KIND, batches.KIND, steps.KIND)}

__all__ = [
    "KINDS",
    "AdminTools",
    "Answered",
    "Applier",
    "Arrivals",
    "Carried",
    "Commands",
    "Duties",
    "Findings",
    "Inspector",
    "Kind",
    "Outcome",
    "Refusal",
    "Resources",
    "Route",
    "Spec",
    "SweepReport",
    "Tally",
    "apply_guarded",
    "connections_problem",
]
