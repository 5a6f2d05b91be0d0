"""``inorder-admin`` command line: parse, then run one command of ``consumer.admin.commands``."""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from consumer.admin.batches import BatchAdmin
from consumer.admin.commands import Admin
from consumer.kinds.batches.decisions import BatchStatus
from consumer.routes import Route
from consumer.settings import SweeperSettings
from consumer.sweeper.gaps import GapStatus
from schemas.runtime.usage import program_version, settings_block

ENTITY = "STREAM:ENTITY_ID, e.g. seat_ledger:sub-1"


def parser() -> argparse.ArgumentParser:
    """The whole command line (deploy/README.md's CLI reference is rendered from it)."""
    root = argparse.ArgumentParser(
        prog="inorder-admin",
        description=__doc__,
        epilog=settings_block(SweeperSettings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument(
        "--version",
        action="version",
        version=f"inorder-admin {program_version()}",
        help="its version",
    )
    root.add_argument("--json", action="store_true", help="JSON lines instead of tables")
    sub = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _reading_commands(sub)
    rep = sub.add_parser(
        "republish",
        help="ask the relay to re-send a range of any routed stream; a projection applies the "
        "newest and counts the rest stale, a step route applies what it lacks",
    )
    rep.add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
    rep.add_argument("--from", dest="from_seq", type=int, required=True, help="first seq")
    rep.add_argument("--to", dest="to_seq", type=int, help="last seq (default: --from)")
    rep.add_argument(
        "--generation", type=int, help="the generation (default: the one the consumer holds)"
    )
    skip = sub.add_parser(
        "skip",
        help="a person's decision that seqs of the open gap will never come: recorded in "
        "inorder_step_skips with who, when and why; the entity moves on and drains",
    )
    skip.add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
    skip.add_argument("--through", type=int, required=True, help="last seq that will not come")
    skip.add_argument("--reason", required=True, help="why (required, not empty)")
    skip.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")
    held = sub.add_parser("held", help="entities whose parking set was full").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    held.add_parser("list", help="held entities")
    held.add_parser(
        "replay", help="send an entity's held events back to the events topic"
    ).add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
    review = sub.add_parser("review", help="steps stopped for a person").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    review.add_parser("list", help="stopped steps, with the reason")
    for action, what in (
        ("confirm", "the earlier call took effect: advance past it"),
        ("retry", "it did not: run it again"),
    ):
        cmd = review.add_parser(action, help=what)
        cmd.add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
        cmd.add_argument("--by", default=getpass.getuser(), help="who decides (default: you)")
    _batch_commands(sub)
    return root


def _reading_commands(sub: Any) -> None:
    g = sub.add_parser("gaps", help="gaps the sweeper found").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    listing = g.add_parser("list", help="gaps, newest first")
    listing.add_argument("--status", choices=list(GapStatus), help="only gaps in this status")
    listing.add_argument("--limit", type=int, default=50, help="most rows (default 50)")
    g.add_parser("show", help="every field of one gap").add_argument(
        "id", type=int, metavar="ID", help="the gap's id"
    )
    sub.add_parser("parked", help="parked events").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    ).add_parser(
        "top", help="entities with most parked events and their oldest park's age"
    ).add_argument("--limit", type=int, default=20, help="most rows (default 20)")
    sub.add_parser(
        "audit",
        help="the outbox against every projection table and step log, entity by entity; "
        "divergences with their likely cause; exit 1 when any is unexplained",
    )
    explain = sub.add_parser(
        "explain",
        help="one entity's whole story: outbox rows, what was applied, parked, held or "
        "stopped, gaps and republish requests, and the audit's verdict",
    )
    explain.add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)


def _batch_commands(sub: Any) -> None:
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


def run(
    argv: Sequence[str], settings: SweeperSettings, routes: Sequence[Route], console: Console
) -> None:
    """Parse ``argv`` and run the command; ``AdminError`` for what cannot be done."""
    args = parser().parse_args(list(argv))
    admin = Admin(settings, routes, console, args.json)
    try:
        _dispatch(admin, args)
    finally:
        admin.close()


def _dispatch(admin: Admin, args: argparse.Namespace) -> None:
    match (args.command, getattr(args, "action", None)):
        case ("gaps", "list"):
            admin.gaps_list(args.status, args.limit)
        case ("gaps", "show"):
            admin.gaps_show(args.id)
        case ("parked", "top"):
            admin.parked_top(args.limit)
        case ("republish", _):
            admin.republish(args.entity, args.from_seq, args.to_seq, args.generation)
        case ("skip", _):
            admin.skip(args.entity, args.through, args.reason, args.by)
        case ("held", "list"):
            admin.held_list()
        case ("held", "replay"):
            admin.held_replay(args.entity)
        case ("audit", _):
            admin.audit()
        case ("explain", _):
            admin.explain(args.entity)
        case ("review", "list"):
            admin.review_list()
        case ("review", action):
            admin.review(args.entity, action == "confirm", args.by)
        case ("batches", _):
            _dispatch_batches(admin.batches, args)


def _dispatch_batches(batches: BatchAdmin, args: argparse.Namespace) -> None:
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


def parse_only(argv: Sequence[str]) -> argparse.Namespace:
    """Parse without running (so usage errors come before any connection)."""
    return parser().parse_args(list(argv))
