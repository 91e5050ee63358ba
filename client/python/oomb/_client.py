"""The synchronous client: Client, its `jobs` resource, and Job."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator, List, Mapping, Optional, TypeVar, Union

import grpc

from oomb._caller import Caller
from oomb._connection import ChannelOptions, Connection, Pem
from oomb._errors import JobCancelled, JobFailed, Unavailable, WaitTimeout, from_rpc_error
from oomb._job import Checkpoint, JobState, _JobBase
from oomb._names import job_name, parent
from oomb._requests import StateLike, create_request, estimate_request, list_request, update_request
from oomb._retry import CREATE, IDEMPOTENT, RetryPolicy, call_with_retry
from oomb._spec import SpecLike
from oomb._transfer import Datasets, download_checkpoint
from oomb._watch import ENDED_EARLY, Watch, drop_reason
from oomb.v1 import health_pb2, health_pb2_grpc, jobs_pb2, jobs_pb2_grpc

__all__ = ["Client", "Jobs", "Job"]

log = logging.getLogger("oomb")
T = TypeVar("T")
Events = Generator[jobs_pb2.JobEvent, None, None]

_SETTLED_CANCEL = frozenset({JobState.CANCELLING, JobState.CANCELLED})
_SETTLED_PAUSE = frozenset({JobState.PAUSING, JobState.PAUSED})
_SETTLED_RESUME = frozenset({JobState.VALIDATING, JobState.QUEUED, JobState.RUNNING, JobState.RECOVERING})
DEFAULT_POLL = 1.0


class Job(_JobBase):
    """A job (see _JobBase for its fields), with the calls that act on it."""

    def __init__(self, proto: jobs_pb2.Job, jobs: "Jobs") -> None:
        super().__init__(proto)
        self._jobs = jobs

    def refresh(self) -> "Job":
        """Reads the job again (GetJob); returns self."""
        self._update(self._jobs._get_proto(self.name))
        return self

    def wait(self, timeout: Optional[float] = None, poll: float = DEFAULT_POLL,
             raise_on_failure: bool = True) -> "Job":
        """Polls the job every `poll` seconds until it is SUCCEEDED, FAILED or CANCELLED.

        A server that is unreachable for a while (restarting, draining) is polled again until
        `timeout`. Returns self, refreshed.

        Raises:
          JobFailed / JobCancelled: the job ended so (when raise_on_failure, the default).
          WaitTimeout: `timeout` seconds passed first (also a TimeoutError).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self.refresh()
            except Unavailable as e:
                log.info("wait %s: %s; polling again", self.name, e)
            if self.done:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(f"job {self.name} still {self.state} after {timeout} s",
                                  code=grpc.StatusCode.DEADLINE_EXCEEDED)
            time.sleep(poll if left is None else max(0.0, min(poll, left)))
        if raise_on_failure:
            if self.state == JobState.FAILED:
                raise JobFailed(self)
            if self.state == JobState.CANCELLED:
                raise JobCancelled(self)
        return self

    def events(self, follow: bool = True, after: int = 0,
               reconnect_timeout: Optional[float] = None) -> Events:
        """The job's events (oomb.v1.JobEvent) after sequence `after`; see Jobs.events. This Job
        follows them: each WatchJob snapshot refreshes it, and the events update its state,
        error and progress."""
        events = self._jobs.events(self.name, follow=follow, after=after, reconnect_timeout=reconnect_timeout,
                                   on_snapshot=self._update)
        try:
            for event in events:
                self._apply(event)
                yield event
        finally:
            events.close()  # closing the generator cancels the stream

    def checkpoints(self) -> List[Checkpoint]:
        """The job's checkpoints still on disk, oldest first."""
        return self._jobs.checkpoints(self.name)

    def download(self, directory: Union[str, os.PathLike], step: Optional[int] = None) -> Path:
        """Downloads the job's final checkpoint (or that of `step`) into `directory`; see
        Jobs.download."""
        return self._jobs.download(self.name, directory, step)

    def cancel(self) -> "Job":
        """Cancels the job; returns self, updated (CANCELLING or CANCELLED)."""
        self._update(self._jobs.cancel(self.name).proto)
        return self

    def pause(self) -> "Job":
        """Pauses the job (QUEUED or RUNNING); returns self, updated."""
        self._update(self._jobs.pause(self.name).proto)
        return self

    def resume(self) -> "Job":
        """Resumes a PAUSED job; returns self, updated."""
        self._update(self._jobs.resume(self.name).proto)
        return self

    def delete(self, purge: bool = False) -> None:
        """Deletes the finished job (its checkpoint files stay, unless `purge`)."""
        self._jobs.delete(self.name, purge=purge)

    def update(self, labels: Optional[Mapping[str, str]] = None, priority: Optional[int] = None,
               display_name: Optional[str] = None) -> "Job":
        """Changes the labels, priority or display name of the job (see Jobs.update); returns
        self, updated."""
        self._update(self._jobs.update(self.name, labels=labels, priority=priority, display_name=display_name).proto)
        return self


class Jobs:
    """`client.jobs`: the JobService calls (proto/oomb/v1/jobs.proto). A job is named by its id
    (`austen-1`) or a resource name the server gave it (`job.name`) wherever `name_or_id` is asked;
    an id is looked for in the client's project when it has one (`projects/{project}/jobs/{id}`),
    else in any of the caller's projects (`jobs/{id}`)."""

    def __init__(self, client: "Client") -> None:
        self._client = client

    def _name(self, name_or_id: str) -> str:
        return job_name(name_or_id, self._client.project)

    def create(self, spec: SpecLike, job_id: Optional[str] = None, request_id: Optional[str] = None,
               validate_only: bool = False, project: Optional[str] = None, timeout: Optional[float] = None) -> Job:
        """Submits a job (CreateJob).

        Args:
          spec: a dict, YAML text, a path to a YAML file (pathlib.Path or str) or a JobSpec; see
            load_spec. Relative paths in a file are resolved against its directory.
          job_id: the id to give the job ([a-z0-9][a-z0-9-]{0,62}); generated by the server when
            None. AlreadyExists when taken.
          request_id: the idempotency key: a CreateJob with a request_id already used returns that
            job instead of creating another. A uuid4 is generated when None; the automatic retries
            (UNAVAILABLE, DEADLINE_EXCEEDED) reuse it.
          validate_only: check and plan only; nothing is stored (the Job returned has the
            effective spec and warnings; its name is empty unless job_id was given).
          project: the project to create it in ("nlp" or "projects/nlp"; default: the client's;
            with neither, the caller's only project, InvalidArgument naming `parent` when it has
            several).
          timeout: this call's deadline in seconds per attempt (default: the client's).

        Raises:
          InvalidArgument (naming `field`), ResourceExhausted (does not fit), AlreadyExists,
          PermissionDenied (a project the caller may not act in), ...
        """
        request = create_request(spec, job_id, request_id, validate_only, self._client._parent(project))
        return Job(self._client._unary("CreateJob", request, timeout, CREATE), self)

    def get(self, name_or_id: str, timeout: Optional[float] = None) -> Job:
        """The job (GetJob)."""
        return Job(self._get_proto(self._name(name_or_id), timeout), self)

    def _get_proto(self, name: str, timeout: Optional[float] = None) -> jobs_pb2.Job:
        return self._client._unary("GetJob", jobs_pb2.GetJobRequest(name=name), timeout)

    def list(self, states: Optional[Iterable[StateLike]] = None, labels: Optional[Mapping[str, str]] = None,
             page_size: Optional[int] = None, project: Optional[str] = None, all_projects: bool = False,
             timeout: Optional[float] = None) -> Iterator[Job]:
        """Every job, newest first, page after page (ListJobs); an iterator of Job.

        Args:
          states: only jobs in any of these (JobState, number or name such as "QUEUED").
          labels: only jobs with all of these labels.
          page_size: jobs per call (server default 50, at most 1000).
          project: only this project's jobs ("nlp" or "projects/nlp"; default: the client's;
            with neither, those of every project the caller may act in). PermissionDenied for a
            project the caller may not act in.
          all_projects: the jobs of every project the caller may act in, whatever the client's
            project (parent "projects/-"); not with `project`.
        """
        request = list_request(states, labels, page_size, self._client._parent(project, all_projects))

        def pages() -> Iterator[Job]:
            while True:
                response = self._client._unary("ListJobs", request, timeout)
                for j in response.jobs:
                    yield Job(j, self)
                if not response.next_page_token:
                    return
                request.page_token = response.next_page_token

        return pages()

    def _mutate(self, method: str, request: Any, timeout: Optional[float], settled: frozenset) -> Job:
        # Retried on UNAVAILABLE. When a retry is refused with FAILED_PRECONDITION, the first
        # attempt may have taken effect with its answer lost: the job's state tells.
        def attempt(n: int) -> jobs_pb2.Job:
            try:
                return self._client._raw(method, request, timeout)
            except grpc.RpcError as e:
                if n > 0 and e.code() == grpc.StatusCode.FAILED_PRECONDITION:  # type: ignore[attr-defined]
                    job = self._get_proto(request.name, timeout)
                    if JobState(job.state) in settled:
                        return job
                raise

        return Job(self._client._retrying(attempt, IDEMPOTENT, method), self)

    def cancel(self, name_or_id: str, timeout: Optional[float] = None) -> Job:
        """Cancels a job (CancelJob): VALIDATING, QUEUED, RUNNING, PAUSED or RECOVERING. It stops
        at the next chunk boundary; the Job returned is CANCELLING or CANCELLED."""
        return self._mutate("CancelJob", jobs_pb2.CancelJobRequest(name=self._name(name_or_id)), timeout,
                            _SETTLED_CANCEL)

    def pause(self, name_or_id: str, timeout: Optional[float] = None) -> Job:
        """Pauses a QUEUED or RUNNING job (PauseJob): checkpoint, release the device, PAUSED."""
        return self._mutate("PauseJob", jobs_pb2.PauseJobRequest(name=self._name(name_or_id)), timeout, _SETTLED_PAUSE)

    def resume(self, name_or_id: str, timeout: Optional[float] = None) -> Job:
        """Puts a PAUSED job back in the queue (ResumeJob), continuing from its pause checkpoint."""
        return self._mutate("ResumeJob", jobs_pb2.ResumeJobRequest(name=self._name(name_or_id)), timeout,
                            _SETTLED_RESUME)

    def delete(self, name_or_id: str, purge: bool = False, timeout: Optional[float] = None) -> None:
        """Deletes a SUCCEEDED, FAILED or CANCELLED job (DeleteJob); its checkpoint files stay
        unless `purge` (the server's storage.retention_days removes them later otherwise)."""
        request = jobs_pb2.DeleteJobRequest(name=self._name(name_or_id), purge=purge)

        def attempt(n: int) -> None:
            try:
                self._client._raw("DeleteJob", request, timeout)
            except grpc.RpcError as e:
                if not (n > 0 and e.code() == grpc.StatusCode.NOT_FOUND):  # type: ignore[attr-defined]
                    raise  # (NOT_FOUND on a retry: the first attempt deleted it)

        self._client._retrying(attempt, IDEMPOTENT, "DeleteJob")

    def estimate(self, spec: SpecLike, project: Optional[str] = None,
                 timeout: Optional[float] = None) -> jobs_pb2.EstimateJobResponse:
        """The memory planner's answer for a spec (EstimateJob): fits, peaks, the longest context
        that fits (`max_seq_len_that_fits`) and what it chose (`choices`). Nothing is stored.
        `project` as in create."""
        request = estimate_request(spec, self._client._parent(project))
        return self._client._unary("EstimateJob", request, timeout)

    def update(self, name_or_id: str, labels: Optional[Mapping[str, str]] = None, priority: Optional[int] = None,
               display_name: Optional[str] = None, timeout: Optional[float] = None) -> Job:
        """Changes the fields given of a job not yet finished (UpdateJob, its update_mask naming
        them); the change is recorded as an event with its actor (JobEvent.actor).

        Args:
          labels: the job's labels become exactly these ({} removes them all).
          priority: the queue priority (higher runs first).
          display_name: spec.display_name.

        Raises:
          ValueError: none of them given.
          FailedPrecondition (the job has finished), InvalidArgument (naming `field`), NotFound.
        """
        request = update_request(self._name(name_or_id), labels, priority, display_name)
        return Job(self._client._unary("UpdateJob", request, timeout), self)

    def checkpoints(self, name_or_id: str, timeout: Optional[float] = None) -> List[Checkpoint]:
        """The job's checkpoints still on disk, oldest first (ListCheckpoints)."""
        response = self._client._unary("ListCheckpoints",
                                       jobs_pb2.ListCheckpointsRequest(name=self._name(name_or_id)), timeout)
        client = self._client
        return [Checkpoint.from_proto(c, lambda d, n=c.name: download_checkpoint(client, n, d))
                for c in response.checkpoints]

    def download(self, name_or_id: str, directory: Union[str, os.PathLike], step: Optional[int] = None) -> Path:
        """Downloads a job's final checkpoint, or that of `step`, into `directory` (created); a
        download cut off there before (or by a server restart) resumes. Each file's CRC-32 is
        checked against the checkpoint's manifest. Returns the directory, which
        `PeftModel.from_pretrained` (an adapter) or `from_pretrained` (a full fine-tune) loads.

        Raises:
          NotFound: no such job, or no such checkpoint on the server's disk.
        """
        name = f"{self._name(name_or_id)}/checkpoints/{'final' if step is None else step}"
        return download_checkpoint(self._client, name, directory)

    def wait(self, name_or_id: str, timeout: Optional[float] = None, poll: float = DEFAULT_POLL,
             raise_on_failure: bool = True) -> Job:
        """`get(name_or_id).wait(...)`: the job once it has ended; see Job.wait."""
        return self.get(name_or_id).wait(timeout=timeout, poll=poll, raise_on_failure=raise_on_failure)

    def events(self, name_or_id: str, follow: bool = True, after: int = 0,
               reconnect_timeout: Optional[float] = None,
               on_snapshot: Optional[Callable[[jobs_pb2.Job], None]] = None) -> "Events":
        """The job's events (oomb.v1.JobEvent: STATE_CHANGED, STEP, CHECKPOINT_SAVED, WARNING, LOG)
        with sequence > `after`, in order, each once.

        follow=False: those stored now (ListJobEvents, every page), then the iterator ends.
        follow=True: a WatchJob stream: the stored events, then live ones until the job has
        ended. When the stream drops (UNAVAILABLE: the daemon restarts or drains, the network
        fails), it reconnects by itself after the last sequence it yielded, with backoff, for as
        long as the server stays unreachable (at most `reconnect_timeout` seconds at a time when
        given, then Unavailable). `on_snapshot` receives the Job message each stream starts with.
        Closing the iterator (break) cancels the stream.
        """
        name = self._name(name_or_id)
        if not follow:
            return self._stored_events(name, after)
        return self._watch(name, after, reconnect_timeout, on_snapshot)

    def _stored_events(self, name: str, after: int) -> "Events":
        while True:
            response = self._client._unary("ListJobEvents",
                                           jobs_pb2.ListJobEventsRequest(name=name, after_sequence=after), None)
            for e in response.events:
                after = e.sequence
                yield e
            if not response.more or not response.events:
                return

    def _watch(self, name: str, after: int, reconnect_timeout: Optional[float],
               on_snapshot: Optional[Callable[[jobs_pb2.Job], None]]) -> "Events":
        client = self._client
        watch = Watch(name, after, reconnect_timeout, client, on_snapshot)
        while True:
            call = client.stub.WatchJob(watch.request(), metadata=client._conn.metadata)
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


class Client:
    """A connection to an oombd server.

    Args:
      endpoint: "host:port" or "unix:/path/oombd.sock"; default $OOMB_ENDPOINT, else
        127.0.0.1:7070 (as the CLI).
      token: the bearer token, sent as `authorization: Bearer <token>`; default $OOMB_TOKEN.
      ca: the CA certificate that verifies the server (a PEM file's path, or its bytes): TLS.
      cert, key: the client certificate and its key, for mTLS (TLS with the system's roots when
        no `ca` is given).
      timeout: the deadline of each unary call attempt, seconds (WatchJob streams have none).
      retry: the RetryPolicy of unary calls (default: RetryPolicy()); RetryPolicy.none() turns
        retries off.
      options: extra gRPC channel options, e.g. [("grpc.max_send_message_length", 64 << 20)].
      project: the project ("nlp" or "projects/nlp") jobs are created in, listed from and
        estimated for, and that a job id is looked for in; default $OOMB_PROJECT (as the CLI's
        --project), else none: the server's default (the caller's only project; for lists and
        ids, every project the caller may act in). "" sets none whatever $OOMB_PROJECT says.

    Use it as a context manager, or call close(). `client.jobs` has the job calls,
    `client.datasets` the uploaded datasets' (oomb._transfer); `stub` and
    `channel` are the generated oomb.v1 JobServiceStub and the grpc.Channel, for what the SDK
    does not wrap (send `metadata` with each call when a token is set).
    """

    def __init__(self, endpoint: Optional[str] = None, token: Optional[str] = None, ca: Optional[Pem] = None,
                 cert: Optional[Pem] = None, key: Optional[Pem] = None, timeout: float = 30.0,
                 retry: Optional[RetryPolicy] = None, options: Optional[ChannelOptions] = None,
                 project: Optional[str] = None) -> None:
        self._conn = Connection(endpoint, token, ca, cert, key, options, project)
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        if self._conn.credentials is not None:
            self.channel: grpc.Channel = grpc.secure_channel(self._conn.endpoint, self._conn.credentials,
                                                             options=self._conn.options)
        else:
            self.channel = grpc.insecure_channel(self._conn.endpoint, options=self._conn.options)
        self.stub = jobs_pb2_grpc.JobServiceStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.jobs = Jobs(self)
        self.datasets = Datasets(self)

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

    def server_info(self, timeout: Optional[float] = None) -> jobs_pb2.ServerInfo:
        """The server's version, devices, memory and whether it is draining (GetServerInfo)."""
        return self._unary("GetServerInfo", jobs_pb2.GetServerInfoRequest(), timeout)

    def whoami(self, timeout: Optional[float] = None) -> Caller:
        """Who the server takes this client for, and the projects it may act in (GetCaller)."""
        return Caller.from_proto(self._unary("GetCaller", jobs_pb2.GetCallerRequest(), timeout))

    def health(self, service: str = "", timeout: Optional[float] = None) -> str:
        """The grpc.health.v1 status: "SERVING", or "NOT_SERVING" while the server drains."""
        request = health_pb2.HealthCheckRequest(service=service)

        def attempt(_: int) -> health_pb2.HealthCheckResponse:
            return self._health.Check(request, timeout=self._deadline(timeout), metadata=self._conn.metadata)

        response = self._retrying(attempt, IDEMPOTENT, "Health.Check")
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def close(self) -> None:
        """Closes the channel; streams in flight end with CANCELLED."""
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<oomb.Client {self._conn!r}>"

    # Plumbing.
    def _deadline(self, timeout: Optional[float]) -> float:
        return self.timeout if timeout is None else timeout

    def _parent(self, project: Optional[str], all_projects: bool = False) -> str:
        """A request's parent: the call's project, else the client's (None: the client's; "": none)."""
        return parent(self.project if project is None and not all_projects else project, all_projects)

    def _raw(self, method: str, request: Any, timeout: Optional[float]) -> Any:
        return getattr(self.stub, method)(request, timeout=self._deadline(timeout), metadata=self._conn.metadata)

    def _retrying(self, attempt: Callable[[int], T], retry_on: frozenset, what: str) -> T:
        try:
            return call_with_retry(attempt, self.retry, retry_on, what)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    def _unary(self, method: str, request: Any, timeout: Optional[float], retry_on: frozenset = IDEMPOTENT) -> Any:
        return self._retrying(lambda _: self._raw(method, request, timeout), retry_on, method)

