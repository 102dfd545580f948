"""The watch loops' back-off: exponential, capped, jittered, reset after success."""

from __future__ import annotations

import random

from gpuquota.kube.backoff import Backoff


def test_backoff_doubles_with_jitter_up_to_the_cap():
    b = Backoff(base=0.5, cap=4.0, rng=random.Random(1))
    delays = [b.next() for _ in range(8)]
    ceilings = [0.5, 1, 2, 4, 4, 4, 4, 4]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len({round(d, 6) for d in delays[3:]}) > 1  # jittered, not lock-step
    b.reset()
    assert 0.25 <= b.next() <= 0.5
