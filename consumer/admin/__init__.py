"""``inorder-admin``: the operator's commands.

``cli`` parses and dispatches, ``commands`` runs the generic ones (``audit``,
``explain``, ``republish``) and hands each kind its tools, ``explain`` gathers one
entity's story, ``audit`` is the means every kind's inspector compares with the
outbox. The kinds' own commands (gaps, parked, skip, held, review, batches) live with
their kind. Each command opens only the connections it needs.
"""
