"""The built-in routing plug-ins, one per file. Importing this package registers every one of them with
``framework.Filter`` / ``framework.Scorer`` (``core`` imports it, so the registry is full wherever the
``Pipeline`` is importable).

====== =================== ======================= =======================================================
kind   config name         file                    reads (and writes)
====== =================== ======================= =======================================================
filter healthy             healthy.py              ``ReplicaSnapshot.healthy``
filter notEjected          not_ejected.py          ``ReplicaSnapshot.ejected``
filter revision            revision.py             ``RequestState.revision`` (the caller sets it from
                                                   ``choose_revision``), ``ReplicaSnapshot.revision``
filter notSaturated        not_saturated.py        ``outstanding_requests``, ``queue_waiting`` against
                                                   ``SaturationLimits``; writes ``RequestState.saturated``
filter freeSlot            free_slot.py            ``outstanding_requests`` against ``concurrency`` (learned
                                                   from the engine's /metrics); keeps all when none is free
filter kvFits              kv_fits.py              ``kv_held_tokens``, ``kv_capacity_tokens``,
                                                   ``RoutingRequest.kv_new_tokens``; keeps all when none fits
                                                   and writes ``RequestState.fits_nowhere``
scorer outstandingTokens   outstanding_tokens.py   ``outstanding_tokens`` + the uncached prompt
                                                   (``expected_load``)
scorer prefixCache         prefix_cache.py         ``RoutingRequest.prefix_match_tokens``, load under
                                                   ``HotSpotGuard``; writes ``RequestState.hotspot_guarded``
scorer kvCache             kv_cache.py             ``kv_usage`` (the engine's /metrics; None when stale)
scorer queue               queue.py                ``queue_waiting`` (the engine's /metrics; None when stale)
scorer outstandingRequests outstanding_requests.py ``outstanding_requests``
====== =================== ======================= =======================================================

Filters are named in ``core.DEFAULT_FILTERS`` (or a configuration's list), scorers by the keys of the weights
(``core.DEFAULT_WEIGHTS``, ``ModelDeployment.spec.routing.weights``).
"""

from tokenyard.router.plugins import (
    free_slot,
    healthy,
    kv_cache,
    kv_fits,
    not_ejected,
    not_saturated,
    outstanding_requests,
    outstanding_tokens,
    prefix_cache,
    queue,
    revision,
)

__all__ = [
    "free_slot",
    "healthy",
    "kv_cache",
    "kv_fits",
    "not_ejected",
    "not_saturated",
    "outstanding_requests",
    "outstanding_tokens",
    "prefix_cache",
    "queue",
    "revision",
]
