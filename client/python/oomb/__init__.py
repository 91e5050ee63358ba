"""oomb: the Python SDK of oombd, the long-context LLM fine-tuning daemon (client/python/README.md).

    import oomb

    with oomb.Client() as client:                      # $OOMB_ENDPOINT, $OOMB_TOKEN, or 127.0.0.1:7070
        job = client.jobs.create("job.yaml")           # a dict, YAML text, a path or a JobSpec
        for event in job.events():                     # follows the job; reconnects by itself
            print(event.sequence, event.progress.step, event.progress.loss)
        job.wait()                                     # raises oomb.JobFailed / oomb.JobCancelled
        job.download("./adapter")                      # the final checkpoint, resumable
        data = client.datasets.upload("train.jsonl")   # then a spec names data.train: datasets/{id}

The API is proto/oomb/v1/jobs.proto; its generated modules are oomb.v1.jobs_pb2 and friends.
"""
from oomb._caller import Caller
from oomb._client import Client, Job, Jobs
from oomb._errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    JobCancelled,
    JobFailed,
    NotFound,
    OombError,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from oomb._job import TERMINAL_STATES, Checkpoint, JobState
from oomb._names import job_id, job_name, project_name
from oomb._retry import RetryPolicy
from oomb._spec import SpecLike, load_spec
from oomb._transfer import Dataset, Datasets, dataset_name
from oomb.aio import AsyncClient, AsyncDatasets, AsyncJob, AsyncJobs

try:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    __version__ = _version("oomb")
except PackageNotFoundError:  # pragma: no cover - imported from a source tree
    __version__ = "0.0.0"

__all__ = [
    "Client", "Jobs", "Job", "AsyncClient", "AsyncJobs", "AsyncJob", "AsyncDatasets", "JobState", "TERMINAL_STATES",
    "Checkpoint",
    "Caller", "RetryPolicy", "SpecLike", "load_spec", "job_name", "job_id", "project_name", "Dataset", "Datasets",
    "dataset_name",
    "OombError", "InvalidArgument", "NotFound", "AlreadyExists", "PermissionDenied", "Unauthenticated",
    "ResourceExhausted", "FailedPrecondition", "Unavailable", "DeadlineExceeded", "Cancelled", "Internal",
    "WaitTimeout", "JobFailed", "JobCancelled", "__version__",
]
