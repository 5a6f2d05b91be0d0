"""Render the documentation's reference tables from the code: settings, commands, metrics, alerts.

Each table sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` in one of
the READMEs (``DOCS``) and is written only by this script (``make reference``); a test
fails when a README differs from what it renders, so the reference cannot drift.

Sources, one per table: the pydantic settings models (variable, default, the field's
description), the argparse parsers (every command, argument and its help), the
registered Prometheus metrics (name, type, labels, help), the envelope's JSON Schema with
the ``Event`` class (the fields a handler receives), the route kinds' documented settings,
the programs' summaries and required settings, and the alert rules with their runbook.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from consumer import __main__ as consumer_main  # noqa: E402
from consumer import metrics as consumer_metrics  # noqa: E402
from consumer.admin import cli as admin_cli  # noqa: E402
from consumer.kinds import KINDS  # noqa: E402
from consumer.kinds._spec import settings as route_settings  # noqa: E402
from consumer.settings import ConsumerSettings, RouteSettings, SweeperSettings  # noqa: E402
from outbox_relay import __main__ as relay_main  # noqa: E402
from outbox_relay import metrics as relay_metrics  # noqa: E402
from outbox_relay.settings import RelaySettings  # noqa: E402
from producer.__main__ import parser as producer_parser  # noqa: E402
from producer.settings import ProducerSettings  # noqa: E402
from producer.worker import WorkerSettings  # noqa: E402
from schemas import DEFAULT_TOPICS, Event  # noqa: E402
from schemas.runtime.config import InorderSettings  # noqa: E402
from schemas.runtime.kafka_settings import KafkaClientSettings  # noqa: E402
from schemas.runtime.usage import settings_of  # noqa: E402
from schemas.security import (  # noqa: E402
    KafkaNames,
    Roles,
    kafka_acls,
    outbox_writes,
    postgres_grants,
)

README = ROOT / "README.md"
# Every file with generated blocks: the front page and one README per audience.
DOCS = (
    README,
    ROOT / "producer" / "README.md",
    ROOT / "consumer" / "README.md",
    ROOT / "outbox_relay" / "README.md",
    ROOT / "deploy" / "README.md",
    ROOT / "tests" / "README.md",
    ROOT / "tests" / "benchmarks" / "README.md",
)
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
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


def _kind_models() -> list[type[InorderSettings]]:
    return [k.process for k in KINDS.values() if k.process is not None]


def kind_settings_table() -> str:
    """kind | variable | default | meaning: each route kind's own process settings."""
    rows = []
    for kind in KINDS.values():
        if kind.process is None:
            continue
        for s in settings_of(kind.process, (InorderSettings,)):
            default = f"`{s.default}`" if s.literal else s.default
            rows.append((f"{kind.name} routes", f"`{s.variable}`", default, s.meaning))
    return _table(("routes", "variable", "default", "meaning"), rows)


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
    return _table(("metric", "type", "labels", "meaning"), _metric_rows(module))


def consumer_metrics_table() -> str:
    """routes | metric | type | labels | meaning: the core's metrics, then each kind's own."""
    rows = [("every kind", *row) for row in _metric_rows(consumer_metrics)]
    for kind in KINDS.values():
        if kind.metrics is not None:
            rows += [(f"{kind.name} routes", *row) for row in _metric_rows(kind.metrics)]
    return _table(("routes", "metric", "type", "labels", "meaning"), rows)


def _metric_rows(module: ModuleType) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for value in vars(module).values():
        if not isinstance(value, Counter | Gauge | Histogram):
            continue
        [described] = value.describe()
        name = described.name + ("_total" if isinstance(value, Counter) else "")
        labels = ", ".join(f"`{label}`" for label in value._labelnames)
        rows.append((f"`{name}`", described.type, labels, described.documentation))
    return rows


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


# ---------------------------------------------------------------- routes files


def _shown(value: Any) -> str:
    if value is MISSING:
        return "required"
    if value is None or value == "":
        return "unset"
    return f"`{json.dumps(value)}`"


def route_settings_table() -> str:
    """kind | setting | default | meaning, for every setting of every registered route kind."""
    rows = []
    for kind in KINDS.values():
        if not kind.settings:
            raise ReferenceError(f"route kind {kind.name} declares no settings")
        for index, cls in enumerate(kind.settings):
            table = "" if index == 0 else f"{cls.__name__.lower()} "
            for name, default, meaning in route_settings(cls):
                rows.append((f"`{kind.name}`", f"{table}`{name}`", _shown(default), meaning))
    return _table(("kind", "setting", "default", "meaning"), rows)


# ---------------------------------------------------------------- processes


# program, what it does (a service's own summary), its settings model, how many to run,
# and what it needs besides its required settings (a Redis the model cannot require).
PROCESSES: tuple[tuple[str, str, type[InorderSettings], str, str], ...] = (
    (
        "inorder-producer migrate",
        "Creates or upgrades the outbox table and its functions; safe from several "
        "processes at once",
        ProducerSettings,
        "once per release, before the relays",
        "",
    ),
    ("inorder-relay", relay_main.SUMMARY, RelaySettings, "2 or more", ""),
    (
        "inorder-consumer",
        consumer_main.CONSUMER_SUMMARY,
        ConsumerSettings,
        "1 up to the partition count",
        "`REDIS_URL` with a step route",
    ),
    (
        "inorder-sweeper",
        consumer_main.SWEEPER_SUMMARY,
        SweeperSettings,
        "2 (one active)",
        "`REDIS_URL`",
    ),
)


def processes_table() -> str:
    """process | what it does | run | needs (required settings) | HTTP port."""
    rows = []
    for program, summary, cls, replicas, also in PROCESSES:
        needs = [f"`{s.variable}`" for s in settings_of(cls) if s.default == "required"]
        port = cls.model_fields["http_port"].default if "http_port" in cls.model_fields else None
        rows.append(
            (
                f"`{program}`",
                summary,
                replicas,
                ", ".join([*needs, also] if also else needs),
                str(port) if port else "none",
            )
        )
    return _table(("process", "what it does", "run", "needs", "HTTP port"), rows)


# ---------------------------------------------------------------- alerts


def alerts_table(where: Path) -> str:
    """alert (linked to its runbook entry) | severity | for | when, from the rule file."""
    rules = yaml.safe_load(RULES.read_text())
    rows = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            url = rule["annotations"].get("runbook_url", "")
            if not url.startswith("deploy/runbook.md#"):
                raise ReferenceError(f"alert {rule['alert']} has no runbook entry")
            link = os.path.relpath(ROOT / url.partition("#")[0], where.parent)
            anchor = url.partition("#")[2]
            rows.append(
                (
                    f"[{rule['alert']}]({link}#{anchor})",
                    rule["labels"]["severity"],
                    rule.get("for", "at once"),
                    re.sub(r"\{\{ \$labels\.(\w+) \}\}", r"a \1", rule["annotations"]["summary"]),
                )
            )
    return _table(("alert", "severity", "for", "when"), rows)


def grants_block() -> str:
    """The GRANT statements of ``schemas.security`` for the default roles, schema public,
    with a batch route (without one, ``inorder_worker`` and the consumers' outbox inserts go)."""
    statements = postgres_grants(
        Roles(),
        "public",
        ["<each projection table>"],
        streams=["<each producer stream>"],
        batch_streams=["batch"],
    )
    grants = (statement for statement in statements if statement.startswith("GRANT"))
    return _table(("statement",), ((f"`{statement};`",) for statement in grants))


def writers_table() -> str:
    """role | entity type | event type: the ``outbox_writers`` rows of ``schemas.security``,
    for a producer stream and a batch route named ``batch``."""
    writes = outbox_writes(Roles(), ["<each producer stream>"], ["batch"])
    rows = ((f"`{w.role}`", f"`{w.entity_type}`", f"`{w.event_type}`") for w in writes)
    return _table(("role", "entity type", "event type"), rows)


def acls_table() -> str:
    """principal | operation | resource, for the default topic and group names."""
    topics = DEFAULT_TOPICS

    def default(cls: type[InorderSettings], name: str) -> str:
        return str(cls.model_fields[name].default)

    names = KafkaNames(
        events=[topics.events],
        dead_letters=topics.dead_letters,
        held=topics.held,
        requests=topics.republish_requests,
        results=topics.republish_results,
        consumer_group=default(ConsumerSettings, "group_id"),
        sweeper_group=default(SweeperSettings, "sweeper_group_id"),
        relay_group=default(RelaySettings, "relay_group_id"),
        outputs=[topics.batch_output],
        work=[topics.batch_work],
        worker_group=str(WorkerSettings.model_fields["group_id"].default),
    )
    rows: dict[tuple[str, str], list[str]] = {}
    for acl in kafka_acls(names):
        what = f"{acl.resource} `{acl.name}`" + (" (prefix)" if acl.prefixed else "")
        rows.setdefault((acl.principal, acl.operation), []).append(what)
    return _table(
        ("principal", "operation", "on"),
        ((f"`{who}`", op, ", ".join(sorted(on))) for (who, op), on in sorted(rows.items())),
    )


# ---------------------------------------------------------------- the documents

BLOCKS: dict[str, Callable[[Path], str]] = {
    "relay-settings": lambda _: settings_table(RelaySettings, (KafkaClientSettings,)),
    "consumer-settings": lambda _: settings_table(
        ConsumerSettings, (KafkaClientSettings, *_kind_models())
    ),
    "kind-settings": lambda _: kind_settings_table(),
    "sweeper-settings": lambda _: settings_table(SweeperSettings, (RouteSettings,)),
    "producer-settings": lambda _: settings_table(ProducerSettings),
    "worker-settings": lambda _: settings_table(WorkerSettings, (KafkaClientSettings,)),
    "kafka-settings": lambda _: settings_table(KafkaClientSettings),
    "admin-cli": lambda _: cli_table(admin_cli.parser()),
    "producer-cli": lambda _: cli_table(producer_parser()),
    "relay-metrics": lambda _: metrics_table(relay_metrics),
    "consumer-metrics": lambda _: consumer_metrics_table(),
    "event-fields": lambda _: event_table(),
    "route-settings": lambda _: route_settings_table(),
    "processes": lambda _: processes_table(),
    "alerts": alerts_table,
    "postgres-grants": lambda _: grants_block(),
    "kafka-acls": lambda _: acls_table(),
    "outbox-writers": lambda _: writers_table(),
}


def render(text: str, where: Path = README, found: set[str] | None = None) -> str:
    """``text`` (the file ``where``) with every generated block rendered afresh.

    Unknown block names fail; the names rendered are added to ``found``.
    """

    def fill(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in BLOCKS:
            raise ReferenceError(f"{where.name}: block {name!r} has no renderer")
        if found is not None:
            found.add(name)
        return f"{match.group(1)}{BLOCKS[name](where)}\n{match.group(3)}"

    return _BLOCK.sub(fill, text)


def render_all() -> dict[Path, str]:
    """Every document rendered; a block that appears in none of them fails."""
    found: set[str] = set()
    rendered = {path: render(path.read_text(), path, found) for path in DOCS}
    missing = sorted(set(BLOCKS) - found)
    if missing:
        raise ReferenceError(f"no document has a block for {', '.join(missing)}")
    return rendered


if __name__ == "__main__":
    for path, text in render_all().items():
        path.write_text(text)
