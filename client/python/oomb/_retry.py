"""Retries with exponential backoff and jitter.

Which calls are retried, and on which codes (the client's `retry` policy bounds the attempts):
  - every idempotent call (reads, server info, health; cancel/pause/resume/delete, whose retry
    after a lost answer is recognised): UNAVAILABLE, i.e. the server was not reached or is
    draining;
  - CreateJob: UNAVAILABLE and DEADLINE_EXCEEDED, with the same request_id, so the server
    returns the job a first attempt may have created instead of creating another.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, FrozenSet, TypeVar

import grpc

__all__ = ["RetryPolicy", "IDEMPOTENT", "CREATE"]

log = logging.getLogger("oomb")
T = TypeVar("T")

IDEMPOTENT: FrozenSet[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE})
CREATE: FrozenSet[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class RetryPolicy:
    """How a call is retried: at most `max_attempts` attempts in all, the n-th retry after
    min(max_backoff, initial_backoff * multiplier**n) seconds, scaled by a random factor in
    [1 - jitter, 1 + jitter]. The default waits about 0.5 + 1 + 2 + 4 s over its 4 retries,
    enough for a daemon to restart. `RetryPolicy.none()` never retries."""

    max_attempts: int = 5
    initial_backoff: float = 0.5
    max_backoff: float = 10.0
    multiplier: float = 2.0
    jitter: float = 0.2

    @classmethod
    def none(cls) -> "RetryPolicy":
        """A policy of one attempt: errors surface at once (for measurements, or your own retries)."""
        return cls(max_attempts=1)

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0 for the first)."""
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** retry)
        return max(0.0, base * random.uniform(1.0 - self.jitter, 1.0 + self.jitter))


def _code(error: grpc.RpcError) -> grpc.StatusCode:
    return error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]


def call_with_retry(fn: Callable[[int], T], policy: RetryPolicy, retry_on: FrozenSet[grpc.StatusCode],
                    what: str) -> T:
    """fn(attempt) until it returns, retrying a grpc.RpcError whose code is in `retry_on`."""
    attempt = 0
    while True:
        try:
            return fn(attempt)
        except grpc.RpcError as e:
            if _code(e) not in retry_on or attempt + 1 >= policy.max_attempts:
                raise
            delay = policy.delay(attempt)
            log.info("%s: %s; retry %d in %.2f s", what, _code(e).name, attempt + 1, delay)
            time.sleep(delay)
            attempt += 1


async def async_call_with_retry(fn: Callable[[int], Awaitable[T]], policy: RetryPolicy,
                                retry_on: FrozenSet[grpc.StatusCode], what: str) -> T:
    """The asyncio form of call_with_retry."""
    attempt = 0
    while True:
        try:
            return await fn(attempt)
        except grpc.RpcError as e:
            if _code(e) not in retry_on or attempt + 1 >= policy.max_attempts:
                raise
            delay = policy.delay(attempt)
            log.info("%s: %s; retry %d in %.2f s", what, _code(e).name, attempt + 1, delay)
            await asyncio.sleep(delay)
            attempt += 1
