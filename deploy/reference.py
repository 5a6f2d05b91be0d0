"""Render the README's reference tables from the code: settings, command lines, metrics, events.

Each table sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` in
README.md and is written only by this script (``make reference``); a test fails when
the README differs from what it renders, so the reference cannot drift from the code.

Sources, one per table: the pydantic settings models (variable, default, the field's
description), the argparse parsers (every command, argument and its help), the
registered Prometheus metrics (name, type, labels, help), and the envelope's JSON
Schema with the ``Event`` class (the fields a handler receives).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from consumer import metrics as consumer_metrics  # noqa: E402
from consumer.admin import cli as admin_cli  # noqa: E402
from consumer.settings import ConsumerSettings, SweeperSettings  # noqa: E402
from outbox_relay import metrics as relay_metrics  # noqa: E402
from outbox_relay.settings import RelaySettings  # noqa: E402
from producer.__main__ import parser as producer_parser  # noqa: E402
from producer.settings import ProducerSettings  # noqa: E402
from producer.worker import WorkerSettings  # noqa: E402
from schemas import Event  # noqa: E402
from schemas.runtime.config import InorderSettings, KafkaClientSettings  # noqa: E402
from schemas.runtime.usage import settings_of  # noqa: E402

README = ROOT / "README.md"
ENVELOPE = ROOT / "schemas" / "json" / "envelope.schema.json"
_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[a-z0-9-]+) -->\n).*?(<!-- end: (?P=name) -->)", re.DOTALL
)


class ReferenceError(Exception):
    """The code cannot be rendered: a setting or command without its description."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- settings


def settings_table(
    cls: type[InorderSettings], without: Sequence[type[InorderSettings]] = ()
) -> str:
    """variable | default | meaning, for the fields of ``cls`` not in ``without``."""
    try:
        found = settings_of(cls, without)
    except ValueError as exc:
        raise ReferenceError(str(exc)) from exc
    rows = [
        (f"`{s.variable}`", f"`{s.default}`" if s.literal else s.default, s.meaning) for s in found
    ]
    return _table(("variable", "default", "meaning"), rows)


# ---------------------------------------------------------------- command lines


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public walk of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def _usage(parser: argparse.ArgumentParser, path: str) -> str:
    """``path POSITIONAL... --required X [--optional Y]``: positionals first, as people type."""
    positionals, options = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            positionals.append(str(action.metavar or action.dest.upper()))
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:
            text = flag
        elif action.choices:
            text = f"{flag} {{{','.join(map(str, action.choices))}}}"
        else:
            text = f"{flag} {action.metavar or action.dest.upper()!s}"
        options.append(text if action.required else f"[{text}]")
    return " ".join([path, *positionals, *options]).strip()


def _arguments(parser: argparse.ArgumentParser, where: str) -> str:
    described = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if not action.help:
            raise ReferenceError(f"{where}: argument {action.dest} has no help")
        name = "/".join(action.option_strings) or (action.metavar or action.dest)
        described.append(f"`{name}` {action.help}")
    return "; ".join(described)


def _commands(
    parser: argparse.ArgumentParser, prog: str, path: str = "", what: str = ""
) -> Iterable[tuple[str, str]]:
    children = _subparsers(parser)
    if not children:
        if not what:
            raise ReferenceError(f"{prog} {path}: command has no help")
        arguments = _arguments(parser, f"{prog} {path}")
        yield f"`{_usage(parser, path)}`", what + (f". {arguments}" if arguments else "")
        return
    helps = _helps(parser)
    for name, child in children.items():
        yield from _commands(child, prog, f"{path} {name}".strip(), helps.get(name, what))


def cli_table(parser: argparse.ArgumentParser) -> str:
    """command | what it does, with each argument's help, for every leaf command."""
    prog = parser.prog
    globals_ = _arguments_of_root(parser)
    rows = list(_commands(parser, prog))
    table = _table(("command", "what it does"), rows)
    return (f"Global options: {globals_}\n\n" if globals_ else "") + table


def _arguments_of_root(parser: argparse.ArgumentParser) -> str:
    return _arguments(parser, parser.prog)


# ---------------------------------------------------------------- metrics


def metrics_table(module: ModuleType) -> str:
    """metric | type | labels | meaning, for every metric a module registers."""
    rows = []
    for value in vars(module).values():
        if not isinstance(value, Counter | Gauge | Histogram):
            continue
        [described] = value.describe()
        name = described.name + ("_total" if isinstance(value, Counter) else "")
        labels = ", ".join(f"`{label}`" for label in value._labelnames)
        rows.append((f"`{name}`", described.type, labels, described.documentation))
    return _table(("metric", "type", "labels", "meaning"), rows)


# ---------------------------------------------------------------- the event a handler gets


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(hint))
        return f"{typing.get_origin(hint).__name__}[{args}]"
    return getattr(hint, "__name__", str(hint))


def event_table() -> str:
    """field | Python type | meaning, from the Event class and the envelope schema."""
    schema = json.loads(ENVELOPE.read_text())
    hints = typing.get_type_hints(Event)
    rows = []
    for f in fields(Event):
        spec = schema["properties"][f.name]
        if "$ref" in spec:
            spec = schema["$defs"][spec["$ref"].rsplit("/", 1)[1]]
        rows.append((f"`{f.name}`", f"`{_type_name(hints[f.name])}`", spec["description"]))
    return _table(("field", "type", "meaning"), rows)


# ---------------------------------------------------------------- the README

BLOCKS: dict[str, Callable[[], str]] = {
    "relay-settings": lambda: settings_table(RelaySettings, (KafkaClientSettings,)),
    "consumer-settings": lambda: settings_table(ConsumerSettings, (KafkaClientSettings,)),
    "sweeper-settings": lambda: settings_table(SweeperSettings, (ConsumerSettings,)),
    "producer-settings": lambda: settings_table(ProducerSettings),
    "worker-settings": lambda: settings_table(WorkerSettings, (KafkaClientSettings,)),
    "kafka-settings": lambda: settings_table(KafkaClientSettings),
    "admin-cli": lambda: cli_table(admin_cli.parser()),
    "producer-cli": lambda: cli_table(producer_parser()),
    "relay-metrics": lambda: metrics_table(relay_metrics),
    "consumer-metrics": lambda: metrics_table(consumer_metrics),
    "event-fields": event_table,
}


def render(text: str) -> str:
    """``text`` with every generated block rendered afresh; unknown block names fail."""
    found = set()

    def fill(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in BLOCKS:
            raise ReferenceError(f"README block {name!r} has no renderer")
        found.add(name)
        return f"{match.group(1)}{BLOCKS[name]()}\n{match.group(3)}"

    rendered = _BLOCK.sub(fill, text)
    missing = sorted(set(BLOCKS) - found)
    if missing:
        raise ReferenceError(f"README has no block for {', '.join(missing)}")
    return rendered


if __name__ == "__main__":
    README.write_text(render(README.read_text()))
