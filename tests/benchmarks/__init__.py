"""Benchmarks: ``make bench`` runs them, writes ``bench-results.json`` and prints a table."""
