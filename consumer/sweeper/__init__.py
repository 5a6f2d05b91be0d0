"""The sweeper: gaps that outlive their deadline are recorded, escalated and repaired.

``service`` is the process (one active at a time, by the Redis ``lease``), ``gaps``
the pure range decisions and the gap table's statements, ``gauges`` the counts over
every entity that only the active sweeper exports.
"""
