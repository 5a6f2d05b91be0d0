"""Publishes the producers' outbox rows to Kafka and re-sends ranges on request."""

try:  # an application's own module named schemas would hide inorder's: say so in one line
    from schemas import PACKAGES  # noqa: F401
except ImportError as exc:
    raise ImportError(
        f"inorder: {exc.path or 'an application module'} is named schemas and hides inorder's "
        "package of that name; rename it"
    ) from None
