"""Query parameters in, held to what the schema says of them.

DRF reads a QueryDict as an HTML form, where an empty value means "not
given": `?tenant=` would list every tenant's invoices as if no filter had
been asked for. A parameter sent empty is a 400 naming it instead."""

from __future__ import annotations

from datetime import timedelta

from rest_framework import serializers

EMPTY = "must not be empty: leave the parameter out instead"


class QueryIn(serializers.Serializer):
    """The base of every serializer of query parameters."""

    def to_internal_value(self, data):
        getlist = getattr(data, "getlist", None)
        empty = {
            name: [serializers.ErrorDetail(EMPTY, code="blank")]
            for name in self.fields
            if name in data and "" in (getlist(name) if getlist else [data[name]])
        }
        if empty:
            raise serializers.ValidationError(empty)
        return super().to_internal_value(data)


# `end`'s description where only the order is a rule: JSON Schema cannot
# state a rule across two fields, so it is said where a client's author
# reads it (an `end` equal to `start` is an empty period: a 400 naming `end`).
END_AFTER_START = "Exclusive; must be after `start` (equal to it: a 400 naming `end`)."


def range_help(longest: str) -> str:
    """`end`'s description: the rule JSON Schema cannot state across two
    parameters, said where a client's author reads it."""
    return (
        f"Exclusive; must be after `start` (equal to it: a 400 naming `end`), "
        f"and at most {longest} after it."
    )


def range_validated(attrs: dict, *, longest: timedelta, why: str = "") -> dict:
    """`start` < `end` <= `start` + `longest`, or a 400 naming `end`."""
    start, end = attrs["start"], attrs["end"]
    if end <= start:
        raise serializers.ValidationError({"end": ["must be after start"]})
    if end - start > longest:
        raise serializers.ValidationError(
            {"end": [f"at most {longest.days} days after start{why}"]}
        )
    return attrs
