"""Exponential back-off with full jitter, for the watch loops and the store writes."""

from __future__ import annotations

import random


class Backoff:
    """Exponential back-off with full jitter: 0.5 s, 1 s, 2 s ... up to ``cap``."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None):
        self.base, self.cap, self.attempt = base, cap, 0
        self.rng = rng or random.Random()

    def next(self) -> float:
        """The next delay in seconds: between half and all of base * 2**attempt (capped)."""
        delay = min(self.cap, self.base * 2**self.attempt)
        self.attempt += 1
        return float(delay / 2 + self.rng.uniform(0, delay / 2))

    def reset(self) -> None:
        """After a success: the next failure waits the base delay again."""
        self.attempt = 0
