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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inorder-admin", description=__doc__)
    parser.add_argument("--json", action="store_true", help="JSON lines instead of tables")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gaps").add_subparsers(dest="action", required=True)
    listing = g.add_parser("list")
    listing.add_argument("--status", choices=list(GapStatus))
    listing.add_argument("--limit", type=int, default=50)
    g.add_parser("show").add_argument("id", type=int)
    sub.add_parser("parked").add_subparsers(dest="action", required=True).add_parser(
        "top"
    ).add_argument("--limit", type=int, default=20)
    rep = sub.add_parser("republish", help="ask the relay to re-send a range")
    rep.add_argument("entity", help="stream:entity_id")
    rep.add_argument("--from", dest="from_seq", type=int, required=True)
    rep.add_argument("--to", dest="to_seq", type=int)
    rep.add_argument("--generation", type=int)
    skip = sub.add_parser("skip", help="advance past seqs that will never come")
    skip.add_argument("entity", help="stream:entity_id")
    skip.add_argument("--through", type=int, required=True)
    skip.add_argument("--reason", required=True)
    skip.add_argument("--by", default=getpass.getuser())
    held = sub.add_parser("held").add_subparsers(dest="action", required=True)
    held.add_parser("list")
    held.add_parser("replay").add_argument("entity", help="stream:entity_id")
    sub.add_parser("audit", help="compare the outbox with the consumer's tables")
    review = sub.add_parser("review").add_subparsers(dest="action", required=True)
    review.add_parser("list")
    for action, what in (("confirm", "the earlier call took effect"), ("retry", "it did not")):
        cmd = review.add_parser(action, help=what)
        cmd.add_argument("entity", help="stream:entity_id")
        cmd.add_argument("--by", default=getpass.getuser())
    _batch_commands(sub)
    return parser


def _batch_commands(sub: Any) -> None:
    b = sub.add_parser("batches", help="batch manifests and decisions").add_subparsers(
        dest="action", required=True
    )
    listing = b.add_parser("list")
    listing.add_argument("--status", choices=list(BatchStatus))
    listing.add_argument("--limit", type=int, default=50)
    show = b.add_parser("show", help="a manifest, position by position")
    decide = b.add_parser("decide", help="release a held batch as incomplete")
    retry = b.add_parser(
        "confirm-retry", help="an uncertain or failed position: retry it, or confirm it applied"
    )
    retry.add_argument(
        "--applied",
        metavar="RESULT_REF",
        help="the earlier write did take effect, with this result",
    )
    for cmd in (listing, show, decide, retry):
        cmd.add_argument("--route", help="the batch route (needed when there are several)")
    for cmd in (show, decide, retry):
        cmd.add_argument("batch_id")
    retry.add_argument("position", type=int)
    for cmd in (decide, retry):
        cmd.add_argument("--by", default=getpass.getuser())
        cmd.add_argument("--reason", required=True)


def run(
    argv: Sequence[str], settings: SweeperSettings, routes: Sequence[Route], console: Console
) -> None:
    """Parse ``argv`` and run the command; ``AdminError`` for what cannot be done."""
    args = _parser().parse_args(list(argv))
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
    return _parser().parse_args(list(argv))
