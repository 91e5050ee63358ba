"""Following a job's events over WatchJob streams, apart from the transport: what Jobs.events and
AsyncJobs.events (follow=True) share. They open the streams, iterate them (`for` / `async for`),
cancel them and sleep (`time.sleep` / `await asyncio.sleep`); a Watch decides the rest:

    watch = Watch(name, after, reconnect_timeout, client, on_snapshot)
    while True:
        call = stub.WatchJob(watch.request(), metadata=...)
        try:
            for response in call:
                event = watch.accept(response)
                if event is not None:
                    yield event
            if watch.finished():
                return
            failure = ENDED_EARLY
        except grpc.RpcError as e:
            failure = drop_reason(e)
        finally:
            call.cancel()
        time.sleep(watch.on_drop(failure))
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional, Protocol

import grpc

from oomb._errors import Unavailable, from_rpc_error
from oomb._job import JobState
from oomb._retry import RetryPolicy
from oomb.v1 import jobs_pb2

__all__ = ["Watch", "ENDED_EARLY", "drop_reason"]

log = logging.getLogger("oomb")

ENDED_EARLY = "the stream ended before the job did"
"""The failure of a stream that ended (OK) while the job had not."""


class _HasRetry(Protocol):
    """A Client or AsyncClient: its `retry` policy spaces the reconnections."""

    retry: RetryPolicy


def drop_reason(error: grpc.RpcError) -> str:
    """The failure of a stream that broke with `error`: "UNAVAILABLE: ..." (it reconnects), else
    raises the OombError of its code (called in the `except` that caught it)."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
        raise from_rpc_error(error) from error
    return f"UNAVAILABLE: {error.details()}"  # type: ignore[attr-defined]


class Watch:
    """The state of a followed job across its WatchJob streams: the last sequence yielded (the
    next stream asks for what follows it), whether the job has ended as the current stream tells,
    and the backoff of the reconnections (reset by each snapshot, i.e. each stream that opened)."""

    def __init__(self, name: str, after: int, reconnect_timeout: Optional[float], client: _HasRetry,
                 on_snapshot: Optional[Callable[[jobs_pb2.Job], None]] = None) -> None:
        self.name = name
        self.last = after
        self.reconnect_timeout = reconnect_timeout
        self.on_snapshot = on_snapshot
        self.terminal = False
        self.retries = 0
        self.down_since: Optional[float] = None
        self._client = client

    def request(self) -> jobs_pb2.WatchJobRequest:
        """The request of the next stream (the events after the last one yielded); the stream
        starts not knowing the job to have ended."""
        self.terminal = False
        return jobs_pb2.WatchJobRequest(name=self.name, after_sequence=self.last)

    def accept(self, response: jobs_pb2.WatchJobResponse) -> Optional[jobs_pb2.JobEvent]:
        """The event of a stream's response to yield, or None: a snapshot (passed to on_snapshot;
        the stream is up) or an event already yielded (a replay after reconnecting)."""
        if response.HasField("snapshot"):
            self.retries, self.down_since = 0, None
            self.terminal = JobState(response.snapshot.state).terminal
            if self.on_snapshot is not None:
                self.on_snapshot(response.snapshot)
            return None
        event = response.event
        if event.sequence <= self.last:
            return None  # already yielded (a replay after reconnecting)
        self.last = event.sequence
        if event.type == jobs_pb2.JobEvent.STATE_CHANGED and JobState(event.state).terminal:
            self.terminal = True
        return event

    def finished(self) -> bool:
        """Whether the job has ended, as the stream that just ended told: nothing more to follow."""
        return self.terminal

    def on_drop(self, failure: str) -> float:
        """The seconds to wait before reconnecting after the stream dropped with `failure` (logged
        at INFO); raises Unavailable once the server has been unreachable for longer than
        reconnect_timeout."""
        now = time.monotonic()
        self.down_since = self.down_since if self.down_since is not None else now
        if self.reconnect_timeout is not None and now - self.down_since > self.reconnect_timeout:
            raise Unavailable(f"watching {self.name}: {failure}; gave up after {self.reconnect_timeout} s",
                              code=grpc.StatusCode.UNAVAILABLE)
        delay = self._client.retry.delay(min(self.retries, 16))
        self.retries += 1
        log.info("watch %s: %s; reconnecting after sequence %d in %.2f s", self.name, failure, self.last, delay)
        return delay
