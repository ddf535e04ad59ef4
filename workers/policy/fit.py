"""How much of one request's optional work fits under a worker's delay bound now.

Admission sheds optional work whose predicted wait passes the bound; a request's extra
candidates are divisible, so rather than refuse a request whose extras would not all fit,
a worker queues those that do and counts the rest as shed for ``overload`` (DESIGN,
*Admission bound*). Two cases: extra candidates beside baseline work (:func:`room`), and the
extras of a whole request on a replica that serves whole requests as optional work
(:func:`extras_that_fit`). Pure: the caller passes the queue and the service model.
"""

from __future__ import annotations

from workers.policy.service_model import ServiceModel

#: Where the search for a whole request's room stops: more extra candidates than any request
#: carries, so the room found is what fits, not what was asked.
ROOM_SEARCH_LIMIT = 1 << 16


def room(service: ServiceModel, ahead: int, bound_ms: float, batch_units: int | None) -> int:
    """Optional units that could fit under ``bound_ms`` behind the ``ahead`` units of
    baseline work queued and of work in service. Queued optional work counts as room:
    lower-value work gives way to higher. Extra candidates are divisible: a request gets as
    many of its extras as fit, instead of none because all of them would not."""
    spare = bound_ms - service.drain_ms(ahead, batch_units)
    if spare <= 0.0:
        return 0
    return int(spare / max(service.per_unit_ms, 1e-9))


def extras_that_fit(service: ServiceModel, ahead: int, extra: int, bound_ms: float,
                    batch_units: int | None) -> int:
    """The most of a whole request's ``extra`` candidates whose drain time, behind the
    ``ahead`` units queued and in flight and the request's own base, stays within
    ``bound_ms`` (``max_queue_delay_ms``, not the whole-request replica's longer deadline
    bound, which only a request's base rides).

    Its extras are RMA work at the powerful model's price per candidate, so they take the
    replica's idle time and give way to other requests' base when it is busy (serving more
    requests with the powerful model is worth more than more candidates on fewer of them).
    Trimming keeps the request where refusing it whole for carrying more than fits would
    send it back to the baseline pool with nothing.
    """
    low, high = 0, extra
    while low < high:  # binary search: drain time grows with the units
        mid = (low + high + 1) // 2
        if service.drain_ms(ahead + mid, batch_units) <= bound_ms:
            low = mid
        else:
            high = mid - 1
    return low
