"""How much of the outbox one statement loads: rows weighed by their text, up to a budget.

A relay reads rows by the hundred per slice; a row's payload may be anything up to what
jsonb holds. A statement that loads rows therefore weighs them as it goes, in its own
order, and stops at a budget of bytes: the running sum follows the order the inner query
already has, so it costs no sort. The first row is taken whatever it weighs, so every
statement moves on. A row whose text (payload and headers) is over the most any message
may hold is not loaded at all: it comes with a NULL payload and NULL headers, to be
marked failed, and weighs its names only. The last row taken is marked when a row after
it was left for the next statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from outbox_relay.rows import OutboxRow, Row
from outbox_relay.settings import RelaySettings

# Where a weighed row carries its cut mark: after the inner query's columns.
CUT: Final = len(OutboxRow._fields)

# The names' bytes are counted as they are; a row's envelope fields add about this.
_ENVELOPE = 64


@dataclass(frozen=True, slots=True)
class Bounds:
    """How much one read may load.

    ``rows``: rows per part; ``bytes``: the text of all rows read (payloads, headers,
    names), shared equally by the parts, each of which still takes its first row;
    ``row_bytes``: the most text one row may have to be loaded at all (a longer one can
    never be a message).
    """

    rows: int
    bytes: int
    row_bytes: int

    @classmethod
    def of(cls, settings: RelaySettings, rows: int) -> Bounds:
        """``rows`` per part, within the relay's read budget and largest message."""
        return cls(rows, settings.read_bytes, settings.max_message_bytes)

    def params(self) -> dict[str, int]:
        """The parameters ``weighed`` statements read: the rows, the budget, the row cap."""
        return {"limit": self.rows, "budget": self.bytes, "max_row": self.row_bytes}


def weighed(inner: str, order: str, budget: str) -> str:
    """SQL: the rows of ``inner`` while their weight adds up to ``budget``, each then marked.

    ``inner`` selects ``FIELDS`` and then the slice and the transaction id (as
    ``COLUMNS`` does), in ``order``; ``budget`` is the parameter that holds the bytes,
    ``%(max_row)s`` the most text a row may have to be loaded (``Bounds.params``).
    """
    return f"""SELECT id, topic, entity_type, entity_id, generation, seq, event_type, event_id,
       CASE WHEN loaded THEN payload END, CASE WHEN loaded THEN headers END, occurred_at,
       slice, txid,
       coalesce(upto + next_weight > %({budget})s, false)
  FROM (SELECT w.*, sum(weight) OVER o AS upto, lead(weight) OVER o AS next_weight,
               row_number() OVER o AS n
          FROM (SELECT t.*, loaded,
                       CASE WHEN loaded THEN text_bytes ELSE 0 END + octet_length(t.topic)
                       + octet_length(t.entity_type) + octet_length(t.entity_id)
                       + octet_length(t.event_type) + octet_length(t.event_id) + {_ENVELOPE}
                       AS weight
                  FROM ({inner}) t,
                       LATERAL (SELECT octet_length(t.payload)
                                       + coalesce(octet_length(t.headers), 0) AS text_bytes) l,
                       LATERAL (SELECT l.text_bytes <= %(max_row)s AS loaded) d) w
        WINDOW o AS (ORDER BY {order} ROWS UNBOUNDED PRECEDING)) b
 WHERE upto <= %({budget})s OR n = 1"""  # noqa: S608 - constants only; values are parameters


def unmarked(records: list[tuple[Any, ...]]) -> tuple[list[Row], bool]:
    """Weighed rows without their marks, and whether the budget left rows behind them."""
    return [record[:CUT] for record in records], any(record[CUT] for record in records)
