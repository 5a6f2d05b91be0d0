"""The batch kind's errors (under the consumer's root) and its dead-letter reason."""

from __future__ import annotations

from consumer.errors import AdminError

# A batch event or worker result the batch cannot take (unknown batch, position out of range).
BATCH_REJECTED = "batch_rejected"


class BatchAdminError(AdminError):
    """Raised when a batch command cannot be done as asked; the message says why."""
