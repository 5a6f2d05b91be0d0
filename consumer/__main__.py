"""Entry points of ``inorder-consumer``, ``inorder-sweeper`` and ``inorder-admin``."""

import sys


def _not_yet(name: str) -> None:
    sys.stderr.write(f"{name}: not implemented yet\n")
    sys.exit(2)


def main() -> None:
    """Run the consumer."""
    _not_yet("inorder-consumer")


def sweeper_main() -> None:
    """Run the gap sweeper."""
    _not_yet("inorder-sweeper")


def admin_main() -> None:
    """Run an operator command."""
    _not_yet("inorder-admin")
