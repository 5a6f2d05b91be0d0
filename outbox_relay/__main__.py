"""Entry point of ``inorder-relay``."""

import sys


def main() -> None:
    """Run the relay."""
    sys.stderr.write("inorder-relay: not implemented yet\n")
    sys.exit(2)
