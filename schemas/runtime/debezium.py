"""Where a Debezium outbox puts inorder's fields: the consumer reads by it, the relay's
republish-only role writes by it. The values are those given to Debezium's EventRouter."""

from __future__ import annotations

from typing import Self

from psycopg import sql
from pydantic import Field, model_validator

from schemas.debezium import ROUTED, Fields, Shape
from schemas.runtime.config import InorderSettings

_COLUMN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"


class DebeziumSettings(InorderSettings):
    """The EventRouter's settings inorder needs, by the router's own names."""

    debezium_placement: str = Field(
        default="type:header:eventType,seq:header:seq",
        description="The router's `table.fields.additional.placement`, as given to Debezium: "
        "the event type, seq and (if any) generation columns must each be placed in a header",
    )
    debezium_route_by_field: str = Field(
        default="aggregatetype",
        pattern=_COLUMN,
        description="The router's `route.by.field`: the column holding the stream (`entity_type`)",
    )
    debezium_topic_replacement: str = Field(
        default=f"outbox.event.{ROUTED}",
        description="The router's `route.topic.replacement`; the stream is read from the part "
        f"`{ROUTED}` stands for, unless the route-by field is placed in a header",
    )
    debezium_type_field: str = Field(
        default="type", pattern=_COLUMN, description="The outbox column holding the event type"
    )
    debezium_seq_field: str = Field(
        default="seq",
        pattern=_COLUMN,
        description="The outbox column holding the entity's version (`seq`), assigned in the "
        "transaction that changes the entity",
    )
    debezium_generation_field: str | None = Field(
        default=None,
        pattern=_COLUMN,
        description="The outbox column holding the generation (unset: every event is generation 1)",
    )

    debezium_table: str = Field(
        default="outbox",
        pattern=r"^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$",
        description="The Debezium outbox table (`name` or `schema.name`): the relay's "
        "republish-only role answers from it, inorder-admin audits and explains against it",
    )
    debezium_id_field: str = Field(
        default="id", pattern=_COLUMN, description="Its `table.field.event.id` column"
    )
    debezium_key_field: str = Field(
        default="aggregateid",
        pattern=_COLUMN,
        description="Its `table.field.event.key` column (the entity id)",
    )
    debezium_payload_field: str = Field(
        default="payload", pattern=_COLUMN, description="Its `table.field.event.payload` column"
    )

    def debezium_table_sql(self) -> sql.Identifier:
        """The Debezium outbox table as a quoted SQL name, schema-qualified when given so."""
        return sql.Identifier(*self.debezium_table.split("."))

    def debezium_fields(self) -> Fields:
        """The table's columns the router reads besides the placed ones."""
        return Fields(self.debezium_id_field, self.debezium_key_field, self.debezium_payload_field)

    def debezium_shape(self) -> Shape:
        """The router configuration as inorder reads and writes it."""
        return Shape(
            placement=self.debezium_placement,
            route_by_field=self.debezium_route_by_field,
            topic_replacement=self.debezium_topic_replacement,
            type_field=self.debezium_type_field,
            seq_field=self.debezium_seq_field,
            generation_field=self.debezium_generation_field,
        )

    @model_validator(mode="after")
    def _places_every_field(self) -> Self:
        problems = self.debezium_shape().problems()
        if problems:
            raise ValueError("the Debezium outbox settings: " + "; ".join(problems))
        return self
