"""``inorder-admin`` command line: parse, connect, run one command of ``consumer.admin``."""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Sequence

from rich.console import Console

from consumer.admin import Admin
from consumer.settings import SweeperSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inorder-admin", description=__doc__)
    parser.add_argument("--json", action="store_true", help="JSON lines instead of tables")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gaps").add_subparsers(dest="action", required=True)
    listing = g.add_parser("list")
    listing.add_argument(
        "--status", choices=["open", "requested", "healed", "unrecoverable", "skipped"]
    )
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
    return parser


def run(argv: Sequence[str], settings: SweeperSettings, console: Console) -> None:
    """Parse ``argv`` and run the command; ``AdminError`` for what cannot be done."""
    args = _parser().parse_args(list(argv))
    admin = Admin(settings, console, args.json)
    try:
        _dispatch(admin, args)
    finally:
        admin.io.conn.close()
        admin.io.lot.client.close()
        admin.io.results.close()


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


def parse_only(argv: Sequence[str]) -> argparse.Namespace:
    """Parse without running (so usage errors come before any connection)."""
    return _parser().parse_args(list(argv))
