"""Publishes the producers' outbox rows to Kafka and re-sends ranges on request."""
