"""One poll batch's way through the consumer, after ``ConsumerService`` polled it.

``poll`` takes what has arrived and routes each event to its route's share; the
kinds apply their shares; ``settle`` sends and records what was refused or held,
counts everything and names the offsets now done; ``offsets`` hands those to Kafka;
``pausing`` waits out an outage without leaving the group.
"""
