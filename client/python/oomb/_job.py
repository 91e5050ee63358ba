"""The Job and Checkpoint wrappers and the JobState enum, shared by Client and AsyncClient."""
from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from google.protobuf import timestamp_pb2

from oomb._names import job_id
from oomb.v1 import job_spec_pb2, jobs_pb2

__all__ = ["JobState", "Checkpoint", "TERMINAL_STATES"]


class JobState(enum.IntEnum):
    """A job's state: the values of oomb.v1.Job.State (jobs.proto), so a JobState compares equal
    to the proto's numbers. `str(state)` is its name ("SUCCEEDED")."""

    STATE_UNSPECIFIED = 0
    VALIDATING = 1
    QUEUED = 2
    RUNNING = 3
    PAUSING = 4
    PAUSED = 5
    CANCELLING = 6
    SUCCEEDED = 7
    FAILED = 8
    CANCELLED = 9
    RECOVERING = 10

    @classmethod
    def _missing_(cls, value: object) -> "JobState":
        # A state a newer server knows and this SDK does not: a member without a name of ours.
        if isinstance(value, int):
            member = int.__new__(cls, value)
            member._name_ = f"STATE_{value}"
            member._value_ = value
            return member
        return None  # type: ignore[return-value]

    @classmethod
    def parse(cls, value: "JobState | int | str") -> "JobState":
        """A JobState from itself, its number or its name (any case)."""
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise ValueError(f"unknown job state {value!r} (known: {', '.join(cls.__members__)})") from None
        return cls(value)

    @property
    def terminal(self) -> bool:
        """SUCCEEDED, FAILED or CANCELLED: the job will not change again."""
        return self in TERMINAL_STATES

    def __str__(self) -> str:
        return self.name


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


def _time(ts: timestamp_pb2.Timestamp) -> Optional[datetime.datetime]:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=datetime.timezone.utc)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint on the server's disk (ListCheckpoints): HF/PEFT-loadable at `path` there, and
    here after `download(directory)`. `name` is what method.lora.init_adapter and
    DownloadCheckpoint take."""

    name: str
    step: int
    path: str
    bytes: int
    final: bool
    create_time: Optional[datetime.datetime]
    load_code: str  # Python that loads it with transformers (and PEFT for an adapter)
    proto: jobs_pb2.Checkpoint
    _download: Optional[Callable[[Any], Path]] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_proto(cls, c: jobs_pb2.Checkpoint, download: Optional[Callable[[Any], Path]] = None) -> "Checkpoint":
        return cls(name=c.name, step=c.step, path=c.path, bytes=c.bytes, final=c.final,
                   create_time=_time(c.create_time), load_code=c.load_code, proto=c, _download=download)

    def download(self, directory: Any) -> Path:
        """Downloads the checkpoint's files into `directory` (created; a download cut off there
        before resumes) and returns it: `PeftModel.from_pretrained(base, directory)` loads an
        adapter. Not available on a Checkpoint made without a client."""
        if self._download is None:
            raise ValueError("this Checkpoint was not listed through a client")
        return self._download(directory)


class _JobBase:
    """A job as the server last described it (a `oomb.v1.Job` message, in `proto`).

    The common fields are properties; any other field of the message is reached as an
    attribute too (`job.queue_position`, `job.dataset`, `job.creator`, ...). `refresh()` reads
    it again. `name` is the server's resource name, opaque: pass it back as it is.
    """

    def __init__(self, proto: jobs_pb2.Job) -> None:
        self._proto = proto

    @property
    def proto(self) -> jobs_pb2.Job:
        """The oomb.v1.Job message."""
        return self._proto

    @property
    def name(self) -> str:
        """The resource name, as the server gives it (opaque: pass it back as it is); empty for a
        validate_only result without job_id."""
        return self._proto.name

    @property
    def id(self) -> str:
        """The job id: the last component of the name."""
        return job_id(self._proto.name)

    @property
    def state(self) -> JobState:
        return JobState(self._proto.state)

    @property
    def done(self) -> bool:
        """True once the job is SUCCEEDED, FAILED or CANCELLED."""
        return self.state.terminal

    @property
    def spec(self) -> job_spec_pb2.JobSpec:
        """The spec as the server stored it: defaults filled, paths absolute."""
        return self._proto.spec

    @property
    def display_name(self) -> str:
        return self._proto.spec.display_name

    @property
    def progress(self) -> jobs_pb2.Progress:
        return self._proto.progress

    @property
    def error(self) -> Optional[jobs_pb2.JobError]:
        """The JobError of a FAILED job (code, reason, message); None otherwise."""
        return self._proto.error if self._proto.HasField("error") else None

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self._proto.labels)

    @property
    def warnings(self) -> List[str]:
        return list(self._proto.warnings)

    @property
    def checkpoint_dir(self) -> str:
        return self._proto.checkpoint_dir

    @property
    def create_time(self) -> Optional[datetime.datetime]:
        return _time(self._proto.create_time)

    @property
    def start_time(self) -> Optional[datetime.datetime]:
        return _time(self._proto.start_time)

    @property
    def end_time(self) -> Optional[datetime.datetime]:
        return _time(self._proto.end_time)

    def __getattr__(self, item: str) -> Any:
        if item.startswith("_"):
            raise AttributeError(item)
        try:
            return getattr(self._proto, item)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__} has no attribute {item!r}") from None

    def _update(self, proto: jobs_pb2.Job) -> None:
        self._proto = proto

    def _apply(self, event: jobs_pb2.JobEvent) -> None:
        """Follows an event of this job: its state (and error), progress and last sequence."""
        p = self._proto
        if event.type == jobs_pb2.JobEvent.STATE_CHANGED:
            p.state = event.state
            if event.HasField("error"):
                p.error.CopyFrom(event.error)
        elif event.type == jobs_pb2.JobEvent.STEP and event.HasField("progress"):
            p.progress.CopyFrom(event.progress)
        if event.sequence > p.last_sequence:
            p.last_sequence = event.sequence

    def __repr__(self) -> str:
        p = self._proto.progress
        step = f", step {p.step}/{p.total_steps}" if p.total_steps else ""
        return f"<{type(self).__name__} {self.name or '(not stored)'} {self.state}{step}>"
