"""Basic auth that an attacker can neither time nor flood.

``WebConfig.authorized`` (exporter/expose/webconfig.py) checks one credential with bcrypt, in the
same time for known and unknown users, and remembers its verdict briefly. This module decides
whether and where that check may run, for the HTTP server's event loop:

* a credential whose verdict is remembered is answered at once, so a scraper with the right
  password pays bcrypt once per ``VERDICT_TTL_S``, never per scrape, and is never throttled;
* every failure costs the client address a token from its bucket (``FAILURE_BURST`` tokens,
  refilled at ``FAILURE_REFILL_PER_S``); an address with none left gets 429 without any bcrypt,
  so a flood of wrong passwords from one address costs almost nothing;
* bcrypt runs in ``BCRYPT_WORKERS`` threads off the event loop, at most ``BCRYPT_QUEUE``
  checks waiting; beyond that the request gets 429 at once, so a flood spread over many
  addresses cannot build an unbounded queue in front of good scrapers.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from gpuquota.exporter.expose.webconfig import WebConfig

FAILURE_BURST = 10  # failed attempts an address may make at once ...
FAILURE_REFILL_PER_S = 0.5  # ... and one more every 2 s after that
MAX_TRACKED_ADDRESSES = 10_000  # the least recently failing are forgotten beyond this
BCRYPT_WORKERS = 1  # one core at most for bcrypt, whatever arrives
BCRYPT_QUEUE = 8  # checks waiting for a worker before new ones are refused


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    DENIED = "denied"  # 401: wrong or missing credentials
    THROTTLED = "throttled"  # 429: too many failures from this address, or bcrypt is saturated


class _Buckets:
    """Per-address token buckets of failed attempts (one failure costs one token)."""

    def __init__(self, burst: float, refill_per_s: float, limit: int) -> None:
        self.burst = burst
        self.refill_per_s = refill_per_s
        self.limit = limit
        self._tokens: OrderedDict[str, tuple[float, float]] = OrderedDict()  # addr -> (t, at)

    def _level(self, address: str, now: float) -> float:
        tokens, at = self._tokens.get(address, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.refill_per_s)

    def exhausted(self, address: str, now: float) -> bool:
        return address in self._tokens and self._level(address, now) < 1.0

    def fail(self, address: str, now: float) -> None:
        self._tokens[address] = (max(0.0, self._level(address, now) - 1.0), now)
        self._tokens.move_to_end(address)
        while len(self._tokens) > self.limit:
            self._tokens.popitem(last=False)

    def refund(self, address: str, now: float) -> None:
        if address in self._tokens:
            self._tokens[address] = (min(self.burst, self._level(address, now) + 1.0), now)

    def retry_after(self, address: str, now: float) -> int:
        missing = 1.0 - self._level(address, now)
        return max(1, int(missing / self.refill_per_s + 0.999))


class AuthGuard:
    """Decides basic-auth requests on the event loop; bcrypt runs in its own thread."""

    def __init__(
        self,
        *,
        burst: float = FAILURE_BURST,
        refill_per_s: float = FAILURE_REFILL_PER_S,
        workers: int = BCRYPT_WORKERS,
        queue: int = BCRYPT_QUEUE,
    ) -> None:
        self._buckets = _Buckets(burst, refill_per_s, MAX_TRACKED_ADDRESSES)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="bcrypt")
        self._capacity = workers + queue
        self._in_flight = 0

    async def check(self, config: WebConfig, header: str | None, address: str) -> Verdict:
        """The verdict on ``header`` from ``address`` under ``config``'s users."""
        if not config.users:
            return Verdict.ALLOWED
        now = time.monotonic()
        remembered = config.remembered(header)
        if remembered is True:
            return Verdict.ALLOWED
        if self._buckets.exhausted(address, now):
            return Verdict.THROTTLED
        if remembered is False:
            self._buckets.fail(address, now)
            return Verdict.DENIED
        if self._in_flight >= self._capacity:
            return Verdict.THROTTLED
        # Charged before the check, refunded on success: concurrent attempts from one
        # address cannot all slip past an almost empty bucket while bcrypt runs.
        self._buckets.fail(address, now)
        self._in_flight += 1  # only the event loop thread touches this counter
        try:
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(self._pool, config.authorized, header)
        finally:
            self._in_flight -= 1
        if ok:
            self._buckets.refund(address, time.monotonic())
            return Verdict.ALLOWED
        return Verdict.DENIED

    def retry_after(self, address: str) -> int:
        """Seconds until ``address`` may try again (for the Retry-After header)."""
        return self._buckets.retry_after(address, time.monotonic())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
