"""The asyncio client (grpc.aio): AsyncClient, with the calls of Client as coroutines.

    async with oomb.AsyncClient() as client:
        job = await client.jobs.create("job.yaml")
        async for event in job.events():
            print(event.sequence, event.type)
        job = await job.wait()

Create it inside the event loop that uses it (a grpc.aio channel belongs to one loop).
Retries, reconnection and errors are those of Client. Datasets (`client.datasets`) and
checkpoint downloads (`jobs.download`) stream on the channel as Client's do (oomb._transfer);
reading, hashing, writing and unpacking files run in a worker thread, off the event loop.
"""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    TypeVar,
    Union,
)

import grpc
import grpc.aio

from oomb._caller import Caller
from oomb._client import _SETTLED_CANCEL, _SETTLED_PAUSE, _SETTLED_RESUME, DEFAULT_POLL
from oomb._connection import ChannelOptions, Connection, Pem
from oomb._errors import JobCancelled, JobFailed, Unavailable, WaitTimeout, from_rpc_error
from oomb._job import Checkpoint, JobState, _JobBase
from oomb._names import job_name, parent
from oomb._requests import StateLike, create_request, estimate_request, list_request, update_request
from oomb._retry import CREATE, IDEMPOTENT, RetryPolicy, async_call_with_retry
from oomb._spec import SpecLike
from oomb._transfer import Dataset, Download, dataset_name, upload_messages, upload_plan
from oomb._watch import ENDED_EARLY, Watch, drop_reason
from oomb.v1 import datasets_pb2, datasets_pb2_grpc, health_pb2, health_pb2_grpc, jobs_pb2, jobs_pb2_grpc

__all__ = ["AsyncClient", "AsyncDatasets", "AsyncJobs", "AsyncJob"]

log = logging.getLogger("oomb")
T = TypeVar("T")
AsyncEvents = AsyncGenerator[jobs_pb2.JobEvent, None]



async def _unpack_on_a_thread(d: Download, call: Any) -> None:
    """Download.unpack (blocking: tarfile and file writes) on a thread, fed the async stream's
    messages through a bounded queue; the stream's RpcError is raised inside it, as the sync
    client's would be."""
    q: "queue.Queue[Any]" = queue.Queue(maxsize=8)
    stopped = threading.Event()

    def messages() -> Iterator[jobs_pb2.DownloadCheckpointResponse]:
        while (item := q.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    def run() -> None:
        try:
            d.unpack(messages())
        finally:
            stopped.set()

    def put(item: Any) -> None:
        while not stopped.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                pass

    unpacking = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        async for message in call:
            if stopped.is_set():
                break
            await asyncio.to_thread(put, message)
        await asyncio.to_thread(put, None)
    except grpc.RpcError as e:
        await asyncio.to_thread(put, e)
    await unpacking

class AsyncJob(_JobBase):
    """A job (see _JobBase for its fields) with coroutine calls; Job's asyncio twin."""

    def __init__(self, proto: jobs_pb2.Job, jobs: "AsyncJobs") -> None:
        super().__init__(proto)
        self._jobs = jobs

    async def refresh(self) -> "AsyncJob":
        """Reads the job again (GetJob); returns self."""
        self._update(await self._jobs._get_proto(self.name))
        return self

    async def wait(self, timeout: Optional[float] = None, poll: float = DEFAULT_POLL,
                   raise_on_failure: bool = True) -> "AsyncJob":
        """As Job.wait: polls until the job has ended; JobFailed / JobCancelled / WaitTimeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                await self.refresh()
            except Unavailable as e:
                log.info("wait %s: %s; polling again", self.name, e)
            if self.done:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(f"job {self.name} still {self.state} after {timeout} s",
                                  code=grpc.StatusCode.DEADLINE_EXCEEDED)
            await asyncio.sleep(poll if left is None else max(0.0, min(poll, left)))
        if raise_on_failure:
            if self.state == JobState.FAILED:
                raise JobFailed(self)
            if self.state == JobState.CANCELLED:
                raise JobCancelled(self)
        return self

    async def events(self, follow: bool = True, after: int = 0,
                     reconnect_timeout: Optional[float] = None) -> AsyncEvents:
        """As Job.events, an async iterator (this AsyncJob follows the events)."""
        events = self._jobs.events(self.name, follow=follow, after=after, reconnect_timeout=reconnect_timeout,
                                   on_snapshot=self._update)
        try:
            async for event in events:
                self._apply(event)
                yield event
        finally:
            await events.aclose()  # closing the generator cancels the stream

    async def download(self, directory: Union[str, os.PathLike], step: Optional[int] = None) -> Path:
        """As Job.download."""
        return await self._jobs.download(self.name, directory, step)

    async def checkpoints(self) -> List[Checkpoint]:
        """The job's checkpoints still on disk, oldest first."""
        return await self._jobs.checkpoints(self.name)

    async def cancel(self) -> "AsyncJob":
        self._update((await self._jobs.cancel(self.name)).proto)
        return self

    async def pause(self) -> "AsyncJob":
        self._update((await self._jobs.pause(self.name)).proto)
        return self

    async def resume(self) -> "AsyncJob":
        self._update((await self._jobs.resume(self.name)).proto)
        return self

    async def delete(self) -> None:
        await self._jobs.delete(self.name)

    async def update(self, labels: Optional[Mapping[str, str]] = None, priority: Optional[int] = None,
                     display_name: Optional[str] = None) -> "AsyncJob":
        """As Job.update: returns self, updated."""
        job = await self._jobs.update(self.name, labels=labels, priority=priority, display_name=display_name)
        self._update(job.proto)
        return self


class AsyncJobs:
    """`AsyncClient.jobs`: the calls of Client.jobs (see Jobs) as coroutines; `list` and
    `events` are async iterators."""

    def __init__(self, client: "AsyncClient") -> None:
        self._client = client

    def _name(self, name_or_id: str) -> str:
        return job_name(name_or_id, self._client.project)

    async def create(self, spec: SpecLike, job_id: Optional[str] = None, request_id: Optional[str] = None,
                     validate_only: bool = False, project: Optional[str] = None,
                     timeout: Optional[float] = None) -> AsyncJob:
        """As Jobs.create."""
        request = create_request(spec, job_id, request_id, validate_only, self._client._parent(project))
        return AsyncJob(await self._client._unary("CreateJob", request, timeout, CREATE), self)

    async def get(self, name_or_id: str, timeout: Optional[float] = None) -> AsyncJob:
        """As Jobs.get."""
        return AsyncJob(await self._get_proto(self._name(name_or_id), timeout), self)

    async def _get_proto(self, name: str, timeout: Optional[float] = None) -> jobs_pb2.Job:
        return await self._client._unary("GetJob", jobs_pb2.GetJobRequest(name=name), timeout)

    async def list(self, states: Optional[Iterable[StateLike]] = None, labels: Optional[Mapping[str, str]] = None,
                   page_size: Optional[int] = None, project: Optional[str] = None, all_projects: bool = False,
                   timeout: Optional[float] = None) -> AsyncIterator[AsyncJob]:
        """As Jobs.list: every job, newest first, page after page."""
        request = list_request(states, labels, page_size, self._client._parent(project, all_projects))
        while True:
            response = await self._client._unary("ListJobs", request, timeout)
            for j in response.jobs:
                yield AsyncJob(j, self)
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    async def _mutate(self, method: str, request: Any, timeout: Optional[float], settled: frozenset) -> AsyncJob:
        async def attempt(n: int) -> jobs_pb2.Job:
            try:
                return await self._client._raw(method, request, timeout)
            except grpc.RpcError as e:
                if n > 0 and e.code() == grpc.StatusCode.FAILED_PRECONDITION:  # type: ignore[attr-defined]
                    job = await self._get_proto(request.name, timeout)
                    if JobState(job.state) in settled:
                        return job
                raise

        return AsyncJob(await self._client._retrying(attempt, IDEMPOTENT, method), self)

    async def cancel(self, name_or_id: str, timeout: Optional[float] = None) -> AsyncJob:
        """As Jobs.cancel."""
        return await self._mutate("CancelJob", jobs_pb2.CancelJobRequest(name=self._name(name_or_id)), timeout,
                                  _SETTLED_CANCEL)

    async def pause(self, name_or_id: str, timeout: Optional[float] = None) -> AsyncJob:
        """As Jobs.pause."""
        return await self._mutate("PauseJob", jobs_pb2.PauseJobRequest(name=self._name(name_or_id)), timeout,
                                  _SETTLED_PAUSE)

    async def resume(self, name_or_id: str, timeout: Optional[float] = None) -> AsyncJob:
        """As Jobs.resume."""
        return await self._mutate("ResumeJob", jobs_pb2.ResumeJobRequest(name=self._name(name_or_id)), timeout,
                                  _SETTLED_RESUME)

    async def delete(self, name_or_id: str, timeout: Optional[float] = None) -> None:
        """As Jobs.delete."""
        request = jobs_pb2.DeleteJobRequest(name=self._name(name_or_id))

        async def attempt(n: int) -> None:
            try:
                await self._client._raw("DeleteJob", request, timeout)
            except grpc.RpcError as e:
                if not (n > 0 and e.code() == grpc.StatusCode.NOT_FOUND):  # type: ignore[attr-defined]
                    raise

        await self._client._retrying(attempt, IDEMPOTENT, "DeleteJob")

    async def estimate(self, spec: SpecLike, project: Optional[str] = None,
                       timeout: Optional[float] = None) -> jobs_pb2.EstimateJobResponse:
        """As Jobs.estimate."""
        request = estimate_request(spec, self._client._parent(project))
        return await self._client._unary("EstimateJob", request, timeout)

    async def update(self, name_or_id: str, labels: Optional[Mapping[str, str]] = None,
                     priority: Optional[int] = None, display_name: Optional[str] = None,
                     timeout: Optional[float] = None) -> AsyncJob:
        """As Jobs.update (ValueError when no field is given)."""
        request = update_request(self._name(name_or_id), labels, priority, display_name)
        return AsyncJob(await self._client._unary("UpdateJob", request, timeout), self)

    async def checkpoints(self, name_or_id: str, timeout: Optional[float] = None) -> List[Checkpoint]:
        """As Jobs.checkpoints."""
        response = await self._client._unary("ListCheckpoints",
                                             jobs_pb2.ListCheckpointsRequest(name=self._name(name_or_id)), timeout)
        return [Checkpoint.from_proto(c) for c in response.checkpoints]

    async def download(self, name_or_id: str, directory: Union[str, os.PathLike], step: Optional[int] = None,
                       attempts: int = 6) -> Path:
        """As Jobs.download: the final checkpoint, or that of `step`, into `directory`, resumable,
        each file's CRC-32 checked."""
        name = f"{self._name(name_or_id)}/checkpoints/{'final' if step is None else step}"
        client = self._client
        d = Download(name, directory, attempts)
        for attempt in range(attempts):
            call = client.stub.DownloadCheckpoint(d.request(), metadata=client.metadata)
            try:
                await _unpack_on_a_thread(d, call)
                break
            except grpc.RpcError as e:
                await asyncio.sleep(d.retry_after(e, attempt))
            finally:
                call.cancel()
        return await asyncio.to_thread(d.finish)

    async def wait(self, name_or_id: str, timeout: Optional[float] = None, poll: float = DEFAULT_POLL,
                   raise_on_failure: bool = True) -> AsyncJob:
        """As Jobs.wait."""
        job = await self.get(name_or_id)
        return await job.wait(timeout=timeout, poll=poll, raise_on_failure=raise_on_failure)

    def events(self, name_or_id: str, follow: bool = True, after: int = 0,
               reconnect_timeout: Optional[float] = None,
               on_snapshot: Optional[Callable[[jobs_pb2.Job], None]] = None) -> AsyncEvents:
        """As Jobs.events, an async iterator (reconnecting by itself when follow=True)."""
        name = self._name(name_or_id)
        if not follow:
            return self._stored_events(name, after)
        return self._watch(name, after, reconnect_timeout, on_snapshot)

    async def _stored_events(self, name: str, after: int) -> AsyncEvents:
        while True:
            response = await self._client._unary(
                "ListJobEvents", jobs_pb2.ListJobEventsRequest(name=name, after_sequence=after), None)
            for e in response.events:
                after = e.sequence
                yield e
            if not response.more or not response.events:
                return

    async def _watch(self, name: str, after: int, reconnect_timeout: Optional[float],
                     on_snapshot: Optional[Callable[[jobs_pb2.Job], None]]) -> AsyncEvents:
        client = self._client
        watch = Watch(name, after, reconnect_timeout, client, on_snapshot)
        while True:
            call = client.stub.WatchJob(watch.request(), metadata=client._conn.metadata)
            try:
                async for response in call:
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
            await asyncio.sleep(watch.on_drop(failure))


class AsyncDatasets:
    """`AsyncClient.datasets`: Datasets' calls as coroutines (oomb._transfer.Datasets)."""

    def __init__(self, client: "AsyncClient") -> None:
        self._client = client
        self.stub = datasets_pb2_grpc.DatasetServiceStub(client.channel)

    async def upload(self, path: Union[str, os.PathLike], dataset_id: Optional[str] = None,
                     display_name: Optional[str] = None, project: Optional[str] = None,
                     attempts: int = 4) -> Dataset:
        """As Datasets.upload."""
        path = Path(path)
        header, hash_late = await asyncio.to_thread(upload_plan, path, dataset_id, display_name,
                                                    self._client._parent(project))

        async def messages() -> AsyncIterator[datasets_pb2.UploadDatasetRequest]:
            stream = upload_messages(path, header, hash_late)  # reads and hashes on a thread
            try:
                while (message := await asyncio.to_thread(next, stream, None)) is not None:
                    yield message
            finally:
                stream.close()

        for attempt in range(attempts):
            try:
                return Dataset.from_proto(await self.stub.UploadDataset(messages(), metadata=self._client.metadata))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt + 1 == attempts:  # type: ignore[attr-defined]
                    raise from_rpc_error(e) from e
                await asyncio.sleep(0.5 * 2 ** attempt)
        raise AssertionError("unreachable")

    async def get(self, name_or_id: str, timeout: Optional[float] = None) -> Dataset:
        """As Datasets.get."""
        request = datasets_pb2.GetDatasetRequest(name=dataset_name(name_or_id, self._client.project))
        return Dataset.from_proto(await self._client._unary("GetDataset", request, timeout, stub=self.stub))

    async def list(self, project: Optional[str] = None, all_projects: bool = False, page_size: Optional[int] = None,
                   timeout: Optional[float] = None) -> AsyncIterator[Dataset]:
        """As Datasets.list, an async iterator."""
        request = datasets_pb2.ListDatasetsRequest(parent=self._client._parent(project, all_projects),
                                                   page_size=page_size or 0)
        while True:
            response = await self._client._unary("ListDatasets", request, timeout, stub=self.stub)
            for d in response.datasets:
                yield Dataset.from_proto(d)
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    async def delete(self, name_or_id: str, timeout: Optional[float] = None) -> None:
        """As Datasets.delete."""
        request = datasets_pb2.DeleteDatasetRequest(name=dataset_name(name_or_id, self._client.project))
        await self._client._unary("DeleteDataset", request, timeout, stub=self.stub)


class AsyncClient:
    """Client's asyncio twin (grpc.aio); the same arguments (see Client). Use `async with`, or
    `await close()`."""

    def __init__(self, endpoint: Optional[str] = None, token: Optional[str] = None, ca: Optional[Pem] = None,
                 cert: Optional[Pem] = None, key: Optional[Pem] = None, timeout: float = 30.0,
                 retry: Optional[RetryPolicy] = None, options: Optional[ChannelOptions] = None,
                 project: Optional[str] = None) -> None:
        self._conn = Connection(endpoint, token, ca, cert, key, options, project)
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        if self._conn.credentials is not None:
            self.channel: grpc.aio.Channel = grpc.aio.secure_channel(self._conn.endpoint, self._conn.credentials,
                                                                     options=self._conn.options)
        else:
            self.channel = grpc.aio.insecure_channel(self._conn.endpoint, options=self._conn.options)
        self.stub = jobs_pb2_grpc.JobServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.jobs = AsyncJobs(self)
        self.datasets = AsyncDatasets(self)

    @property
    def endpoint(self) -> str:
        return self._conn.endpoint

    @property
    def metadata(self) -> tuple:
        """The call metadata the client sends (the authorization header when a token is set)."""
        return self._conn.metadata

    @property
    def project(self) -> Optional[str]:
        """The client's project id ("nlp"), or None."""
        return self._conn.project

    async def server_info(self, timeout: Optional[float] = None) -> jobs_pb2.ServerInfo:
        """As Client.server_info."""
        return await self._unary("GetServerInfo", jobs_pb2.GetServerInfoRequest(), timeout)

    async def whoami(self, timeout: Optional[float] = None) -> Caller:
        """As Client.whoami: the Caller (GetCaller)."""
        return Caller.from_proto(await self._unary("GetCaller", jobs_pb2.GetCallerRequest(), timeout))

    async def health(self, service: str = "", timeout: Optional[float] = None) -> str:
        """As Client.health: "SERVING" or "NOT_SERVING"."""
        request = health_pb2.HealthCheckRequest(service=service)

        async def attempt(_: int) -> health_pb2.HealthCheckResponse:
            return await self._health.Check(request, timeout=self._deadline(timeout), metadata=self._conn.metadata)

        response = await self._retrying(attempt, IDEMPOTENT, "Health.Check")
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<oomb.AsyncClient {self._conn!r}>"

    def _deadline(self, timeout: Optional[float]) -> float:
        return self.timeout if timeout is None else timeout

    def _parent(self, project: Optional[str], all_projects: bool = False) -> str:
        return parent(self.project if project is None and not all_projects else project, all_projects)

    def _raw(self, method: str, request: Any, timeout: Optional[float], stub: Any = None) -> Awaitable[Any]:
        return getattr(stub or self.stub, method)(request, timeout=self._deadline(timeout),
                                                  metadata=self._conn.metadata)

    async def _retrying(self, attempt: Callable[[int], Awaitable[T]], retry_on: frozenset, what: str) -> T:
        try:
            return await async_call_with_retry(attempt, self.retry, retry_on, what)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    async def _unary(self, method: str, request: Any, timeout: Optional[float],
                     retry_on: frozenset = IDEMPOTENT, stub: Any = None) -> Any:
        """One unary call of the JobService (or of `stub`), retried as Client's are."""
        async def attempt(_: int) -> Any:
            return await self._raw(method, request, timeout, stub)

        return await self._retrying(attempt, retry_on, method)
