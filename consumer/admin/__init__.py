"""``inorder-admin``: the operator's commands.

``cli`` parses and dispatches, ``commands`` runs gap, parking, held and review
commands, ``batches`` the batch commands, ``audit`` compares the outbox with what the
consumer made of it. Each command opens only the connections it needs.
"""
