"""Who may use the endpoint: a Bearer key when one is set; never an open port beyond this machine by accident."""
from __future__ import annotations

import hmac
import ipaddress

from .errors import ApiError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def check_exposure(host: str, api_key: str | None, insecure_no_key: bool) -> None:
    if not api_key and not insecure_no_key and not is_loopback(host):
        raise ValueError(f"serving on {host} without --api-key would let anyone on the network use the ring; "
                         "set --api-key KEY (or --insecure-no-key if you mean it)")


def check_key(authorization: str | None, api_key: str | None) -> None:
    if not api_key:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", code="invalid_api_key")
