"""``inorder-admin`` command line: the generic commands, then each route kind's own."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from rich.console import Console

from consumer.admin import letters
from consumer.admin.commands import Admin
from consumer.kinds import KINDS, Kind, Route
from consumer.settings import SweeperSettings
from schemas.runtime.usage import program_version, settings_block

ENTITY = "STREAM:ENTITY_ID, e.g. seat_ledger:sub-1"


def parser(kinds: Mapping[str, Kind] = KINDS) -> argparse.ArgumentParser:
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
    sub.add_parser(
        "audit",
        help="the outbox against every route's tables, entity by entity; divergences with "
        "their likely cause; exit 1 when any is unexplained",
    )
    explain = sub.add_parser(
        "explain",
        help="one entity's whole story: outbox rows, what its route holds (applied, parked, "
        "held or stopped, gaps), dead letters, and the audit's verdict",
    )
    explain.add_argument("entity", metavar="STREAM:ENTITY", help=ENTITY)
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
    letters.add(sub)
    for kind in kinds.values():
        if kind.commands is not None:
            kind.commands.add(sub)
    return root


def run(
    argv: Sequence[str],
    settings: SweeperSettings,
    routes: Sequence[Route],
    console: Console,
    kinds: Mapping[str, Kind] = KINDS,
) -> None:
    """Parse ``argv`` and run the command; ``AdminError`` for what cannot be done."""
    args = parser(kinds).parse_args(list(argv))
    admin = Admin(settings, routes, console, args.json, kinds)
    try:
        match args.command:
            case "audit":
                admin.audit()
            case "explain":
                admin.explain(args.entity)
            case "republish":
                admin.republish(args.entity, args.from_seq, args.to_seq, args.generation)
            case "dead-letters":
                letters.run(args, admin)
            case name:
                admin.run_kind_command(name, args)
    finally:
        admin.close()


def parse_only(argv: Sequence[str]) -> argparse.Namespace:
    """Parse without running (so usage errors come before any connection)."""
    return parser().parse_args(list(argv))
