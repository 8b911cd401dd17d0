"""Times on the wire: every time the controller writes or reads is formatted and parsed here.

Three precisions, each where Kubernetes or our own records need it:
- `rfc3339`: whole seconds with `Z`, as `metav1.Time` is (status and condition times,
  checkpoint times, stamps in annotations a person reads);
- `rfc3339_exact`: microseconds when the time has any, else whole seconds (our own records:
  the quarantine record and history on a Node, fault keys, and the `GPUHealthy` condition,
  whose `lastTransitionTime` the API server truncates to seconds when it stores it);
- `rfc3339_micro`: always microseconds, as `metav1.MicroTime` is (an Event's `eventTime`,
  a Lease's `renewTime` and `acquireTime`).

Every formatter maps None to None, so an absent time stays absent. `parse` is for times
other components wrote (None for anything that is not one; a time without a zone is UTC);
`parse_strict` is for our own records, whose damage must be reported naming the field.
"""

from __future__ import annotations

import datetime as dt
from typing import overload

_SECONDS = "%Y-%m-%dT%H:%M:%SZ"
_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


@overload
def rfc3339(when: dt.datetime) -> str: ...
@overload
def rfc3339(when: None) -> None: ...
def rfc3339(when: dt.datetime | None) -> str | None:
    """Format as Kubernetes' `metav1.Time`: UTC, whole seconds, `Z`."""
    return None if when is None else when.astimezone(dt.UTC).strftime(_SECONDS)


@overload
def rfc3339_exact(when: dt.datetime) -> str: ...
@overload
def rfc3339_exact(when: None) -> None: ...
def rfc3339_exact(when: dt.datetime | None) -> str | None:
    """Format as UTC with `Z`, keeping microseconds only when the time has any."""
    if when is None:
        return None
    return when.astimezone(dt.UTC).strftime(_MICRO).replace(".000000Z", "Z")


@overload
def rfc3339_micro(when: dt.datetime) -> str: ...
@overload
def rfc3339_micro(when: None) -> None: ...
def rfc3339_micro(when: dt.datetime | None) -> str | None:
    """Format as Kubernetes' `metav1.MicroTime`: UTC, always six decimals, `Z`."""
    return None if when is None else when.astimezone(dt.UTC).strftime(_MICRO)


def parse(value: object) -> dt.datetime | None:
    """Read a time another component wrote; None for anything that is not one (a time
    without a zone is taken as UTC, as Kubernetes writes only UTC)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def parse_strict(value: object, field: str) -> dt.datetime:
    """Read a time from one of our own records, raising ValueError naming `field`."""
    if not isinstance(value, str):
        msg = f"{field}: expected an RFC 3339 time string, got {type(value).__name__}"
        raise ValueError(msg)
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError as err:
        msg = f"{field}: not an RFC 3339 time: {value!r}"
        raise ValueError(msg) from err
    if when.tzinfo is None:
        msg = f"{field}: time without a zone: {value!r}"
        raise ValueError(msg)
    return when


def require_aware(field: str, when: dt.datetime) -> None:
    """ValueError naming `field` unless `when` carries a time zone (a programming error: the
    controller's clocks are all UTC)."""
    if when.tzinfo is None:
        msg = f"{field} must be timezone-aware, got naive {when.isoformat()}"
        raise ValueError(msg)
