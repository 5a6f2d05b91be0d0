"""The sweeper: one active at a time (the Redis ``lease``), running each route kind's duties.

``service`` is the process: the lease, the tick loop, the republish results handed to
the kind of their stream, and the kinds' gauges. What a sweep does for a kind lives with
the kind (step routes' gap repair, batch routes' expiry).
"""
