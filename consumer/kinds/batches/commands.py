"""``inorder-admin batches``: see manifests, release held batches, settle uncertain positions.

Every decision is recorded in ``inorder_batch_actions`` with who and why, and the batch
is decided again at once, under its lock, with the consumer's own code.
"""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from consumer.kinds._plugin import AdminTools, Commands
from consumer.kinds.batches.decisions import Batch, Item
from consumer.kinds.batches.errors import BatchAdminError
from consumer.kinds.batches.plan import Share
from consumer.kinds.batches.route import BatchRoute
from consumer.kinds.batches.runner import BatchRunner
from consumer.kinds.batches.store import BatchStore
from schemas.batches import Action, BatchStatus, ItemState

Show = Callable[[str, Sequence[dict[str, Any]]], None]
RETRYABLE = (ItemState.NEEDS_REVIEW, ItemState.FAILED, ItemState.ABANDONED)
_LIST = """
SELECT b.route, b.batch_id, b.status, b.expected_count, b.revision,
       count(*) FILTER (WHERE i.state = %(done)s) AS done,
       count(*) FILTER (WHERE i.state = %(pending)s) AS pending,
       count(*) FILTER (WHERE i.state = ANY(%(not_done)s)) AS not_done,
       b.deadline_at, b.reason
FROM inorder_batches AS b
LEFT JOIN inorder_batch_items AS i ON i.route = b.route AND i.batch_id = b.batch_id
WHERE (%(status)s::text IS NULL OR b.status = %(status)s) AND b.route = ANY(%(routes)s)
GROUP BY b.route, b.batch_id
ORDER BY b.updated_at DESC
LIMIT %(limit)s
"""


class BatchAdmin:
    """The batch commands over one connection and the routes file's batch routes."""

    def __init__(self, runner: BatchRunner, conn: psycopg.Connection[Any], show: Show) -> None:
        self.runner = runner
        self.conn = conn
        self.show = show

    def route(self, stream: str | None) -> BatchRoute:
        """The named batch route, or the only one when none is named."""
        routes = self.runner.routes
        if stream is None and len(routes) == 1:
            return next(iter(routes.values()))
        if stream is None:
            raise BatchAdminError(f"name the route with --route ({', '.join(sorted(routes))})")
        if stream not in routes:
            raise BatchAdminError(f"{stream!r} is not a batch route")
        return routes[stream]

    def _batch(self, store: BatchStore, batch_id: str) -> Batch:
        batch = store.batches(self.conn, [batch_id]).get(batch_id)
        if batch is None:
            raise BatchAdminError(f"there is no batch {batch_id!r} in route {store.route}")
        return batch

    def listing(self, stream: str | None, status: str | None, limit: int) -> None:
        """Batches, most recently changed first, with how many positions are where."""
        routes = [self.route(stream).stream] if stream else sorted(self.runner.routes)
        params = {
            "status": status,
            "routes": routes,
            "limit": limit,
            "done": ItemState.DONE,
            "pending": ItemState.PENDING,
            "not_done": list(RETRYABLE),
        }
        cur = self.conn.execute(_LIST, params)
        names = [c.name for c in cur.description or ()]
        self.show("batches", [dict(zip(names, row, strict=True)) for row in cur.fetchall()])

    def manifest(self, stream: str | None, batch_id: str) -> None:
        """One batch's manifest, position by position."""
        store = self.runner.stores[self.route(stream).stream]
        batch = self._batch(store, batch_id)
        self.show(
            f"batch {batch_id}: {batch.status}, revision {batch.revision}",
            [_item_row(i) for i in store.all_items(self.conn, batch_id)],
        )

    def decide(self, stream: str | None, batch_id: str, by: str, reason: str) -> None:
        """Release a held batch: assemble it now, marked incomplete, missing positions listed."""
        route = self.route(stream)
        store = self.runner.stores[route.stream]
        with self.conn.transaction():
            share = Share(route, store.load(self.conn, [batch_id]))
            batch = self._found(share, batch_id)
            if batch.status != BatchStatus.HELD:
                raise BatchAdminError(f"batch {batch_id} is {batch.status}, not held")
            store.record_action(self.conn, batch_id, None, Action.RELEASE_INCOMPLETE, by, reason)
            share.settle([batch_id], release=True, reason=f"released by {by}")
            self.runner.write(self.conn, share)
        share.outcome().count(route.stream)
        self.show("decided", [{"batch": batch_id, "assembled": dict(share.assembled), "by": by}])

    def confirm_retry(
        self,
        stream: str | None,
        batch_id: str,
        position: int,
        *,
        applied_ref: str | None,
        by: str,
        reason: str,
    ) -> None:
        """Settle a position that did not finish cleanly.

        With ``applied_ref`` a person confirms the earlier write did take effect: the
        position is done with that result. Without it, that it did not: the position is
        dispatched again as a new attempt, and the batch waits for it.
        """
        route = self.route(stream)
        store = self.runner.stores[route.stream]
        with self.conn.transaction():
            share = Share(route, store.load(self.conn, [batch_id], [(batch_id, position)]))
            batch = self._found(share, batch_id)
            if batch.stopped:
                raise BatchAdminError(
                    f"batch {batch_id} is {batch.status}: {batch.status} stops it"
                )
            item = share.rows.get((batch_id, position))
            if item is None:
                raise BatchAdminError(f"batch {batch_id} has no position {position}")
            if item.state not in RETRYABLE:
                raise BatchAdminError(
                    f"position {position} is {item.state}; "
                    f"only {', '.join(RETRYABLE)} positions can be settled"
                )
            if applied_ref is not None:
                settled = Item(position, item.item_key, ItemState.DONE, applied_ref, item.attempts)
                action = Action.CONFIRMED_APPLIED
                share.change(batch_id, settled)
            else:
                settled = Item(position, item.item_key, ItemState.PENDING, None, item.attempts + 1)
                action = Action.RETRIED
                store.extend_deadline(self.conn, batch_id)
                share.change(batch_id, settled)
                share.dispatch(batch_id, [settled])
            store.record_action(self.conn, batch_id, position, action, by, reason)
            share.settle([batch_id])
            self.runner.write(self.conn, share)
        share.outcome().count(route.stream)
        self.show(
            "settled",
            [
                {
                    "batch": batch_id,
                    "position": position,
                    "decision": action,
                    "attempt": settled.attempts,
                    "branch": str(share.decided.get(batch_id, "")),
                    "by": by,
                }
            ],
        )

    @staticmethod
    def _found(share: Share, batch_id: str) -> Batch:
        batch = share.batches.get(batch_id)
        if batch is None:
            raise BatchAdminError(f"there is no batch {batch_id!r} in route {share.route.stream}")
        return batch


def _item_row(item: Item) -> dict[str, Any]:
    return {
        "position": item.position,
        "item_key": item.item_key,
        "state": item.state,
        "attempts": item.attempts,
        "result_ref": item.result_ref,
        "finished_at": item.finished_at,
        "error": item.error,
    }


def add(sub: Any) -> None:
    """``batches list|show|decide|confirm-retry`` in inorder-admin's command line."""
    b = sub.add_parser("batches", help="batch manifests and decisions").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    listing = b.add_parser("list", help="batches with their counts by state")
    listing.add_argument("--status", choices=list(BatchStatus), help="only batches in this status")
    listing.add_argument("--limit", type=int, default=50, help="most rows (default 50)")
    show = b.add_parser("show", help="a manifest, position by position")
    decide = b.add_parser(
        "decide",
        help="release a held batch: assemble it now, marked incomplete, missing positions listed",
    )
    retry = b.add_parser(
        "confirm-retry",
        help="a position that failed, was abandoned or needs review: without --applied the "
        "earlier write did not take effect, so dispatch it again (the batch's wait restarts)",
    )
    retry.add_argument(
        "--applied",
        metavar="RESULT_REF",
        help="the earlier write did take effect, with this result: the position is done",
    )
    for cmd in (listing, show, decide, retry):
        cmd.add_argument("--route", help="the batch route's stream (needed when there are several)")
    for cmd in (show, decide, retry):
        cmd.add_argument("batch_id", metavar="BATCH", help="the batch's id")
    retry.add_argument("position", type=int, metavar="POSITION", help="the position, from 1")
    for cmd in (decide, retry):
        cmd.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")
        cmd.add_argument("--reason", required=True, help="why (required, not empty)")


def run(args: argparse.Namespace, tools: AdminTools, routes: Sequence[BatchRoute]) -> None:
    """Run one parsed ``batches`` command."""
    batches = BatchAdmin(BatchRunner(routes), tools.conn, tools.show)
    match args.action:
        case "list":
            batches.listing(args.route, args.status, args.limit)
        case "show":
            batches.manifest(args.route, args.batch_id)
        case "decide":
            batches.decide(args.route, args.batch_id, args.by, args.reason)
        case "confirm-retry":
            batches.confirm_retry(
                args.route,
                args.batch_id,
                args.position,
                applied_ref=args.applied,
                by=args.by,
                reason=args.reason,
            )


COMMANDS = Commands(("batches",), add, run)
