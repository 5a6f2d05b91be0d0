"""The projection kind's dead-letter reason."""

from __future__ import annotations

# An event whose row PostgreSQL refused (a value that does not fit its column).
PROJECTION_REJECTED = "projection_rejected"
