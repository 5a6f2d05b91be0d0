"""Plumbing shared by the processes, kept apart from the contract in ``schemas``.

Settings loading (``config``), JSON logs (``logs``), the health server and process
lifecycle (``health``, ``process``), waiting out a dependency that is down
(``backoff``, ``outages``) and versioned SQL migrations (``migrate``).
"""
