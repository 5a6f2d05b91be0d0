"""What a producer wrote reaches the operator's terminal as text: no markup, no escapes."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from consumer.admin import output

HOSTILE = {
    "detail": "[bold red]all is well[/bold red] [link=https://example.invalid]docs[/link]",
    "trace": "ok\x1b[2J\x1b]0;owned\x07\x9b31m",
    "entity": "a\u202eevil\tb\nc\rd\\e",
    "at": datetime(2026, 12, 5, 10, 0, tzinfo=UTC),
}


def _printed(terminal: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=400, color_system=None)
    output.show(console, "letters [blink]x[/blink]", [HOSTILE], as_json=False)
    return out.getvalue()


@pytest.mark.parametrize("terminal", [True, False])
def test_markup_is_printed_as_written_and_controls_escaped(terminal: bool) -> None:
    """A table on a terminal, TSV in a pipe: markup shows as written, no control char gets out."""
    printed = _printed(terminal)
    assert "[bold red]all is well[/bold red]" in printed
    assert "[link=https://example.invalid]docs[/link]" in printed
    assert "[blink]x[/blink]" in printed
    assert "ok\\u001b[2J\\u001b]0;owned\\u0007\\u009b31m" in printed
    assert "a\\u202eevil\\tb\\nc\\rd\\\\e" in printed
    assert not any(c in printed for c in "\x1b\x07\x9b\u202e\r\t" if terminal or c != "\t")


@given(st.text())
def test_no_value_puts_a_control_character_on_the_line(value: str) -> None:
    """Whatever a value holds, its printed form is one line of printable text."""
    shown = output.plain(value)
    assert output._CONTROL.search(shown) is None
    assert "\n" not in shown
