"""Request ids on pages. `{{ id|request_id_short }}`: short enough for a
table column, yet telling rows apart: the id's start and its end with the
middle elided. The gateway's ids are "gw-", its process's random half, the
hour and a count (serving.records), so ids of one process share all but
their last digits: cutting the end off (as truncatechars does) shows every
row the same."""

from django import template

register = template.Library()

HEAD = 8  # "gw-" and the start of the process's half: which gateway
TAIL = 12  # the count's last digits: which request


@register.filter
def request_id_short(request_id: str) -> str:
    if len(request_id) <= HEAD + TAIL + 1:
        return request_id
    return f"{request_id[:HEAD]}\u2026{request_id[-TAIL:]}"
