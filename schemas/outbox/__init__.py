"""The outbox: its table (versioned migrations here) and the writer that joins a transaction.

Producers write their events through it, and so does the consumer when a batch route
emits its assembled output, so it lives below both.
"""

from schemas.outbox.async_writer import emit_async, emit_many_async
from schemas.outbox.events import OutboxEvent
from schemas.outbox.writer import emit, emit_many
from schemas.runtime.migrate import MigrationSet

# The outbox table's migrations, applied by ``inorder-producer migrate`` and by a
# consumer that has batch routes (it writes its output through its own outbox).
MIGRATIONS = MigrationSet("outbox", "schemas.outbox")

__all__ = ["MIGRATIONS", "OutboxEvent", "emit", "emit_async", "emit_many", "emit_many_async"]
