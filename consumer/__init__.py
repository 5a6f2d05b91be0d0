"""The long-running consumer that makes per-entity event streams correct in any arrival order."""
