"""The JobService requests that Client and AsyncClient build alike (no I/O): CreateJob, ListJobs,
EstimateJob and UpdateJob. `parent` is the client's `_parent(...)` of the call."""
from __future__ import annotations

import uuid
from typing import Any, Iterable, Mapping, Optional, Union, cast

from oomb._job import JobState
from oomb._spec import SpecLike, load_spec
from oomb.v1 import jobs_pb2

StateLike = Union[JobState, int, str]


def create_request(spec: SpecLike, job_id: Optional[str], request_id: Optional[str], validate_only: bool,
                   parent: str) -> jobs_pb2.CreateJobRequest:
    """The CreateJobRequest of Jobs.create and AsyncJobs.create: a uuid4 request_id when none is
    given (kept by the automatic retries), none for validate_only unless given."""
    request = jobs_pb2.CreateJobRequest(job_id=job_id or "", validate_only=validate_only, parent=parent)
    request.spec.CopyFrom(load_spec(spec))
    if not validate_only:
        request.request_id = request_id or str(uuid.uuid4())
    elif request_id:
        request.request_id = request_id
    return request


def list_request(states: Optional[Iterable[StateLike]], labels: Optional[Mapping[str, str]],
                 page_size: Optional[int], parent: str) -> jobs_pb2.ListJobsRequest:
    """The first ListJobsRequest of Jobs.list and AsyncJobs.list (the pages set page_token)."""
    return jobs_pb2.ListJobsRequest(page_size=page_size or 0,
                                    states=cast(Any, [int(JobState.parse(s)) for s in states or ()]),
                                    labels=dict(labels or {}), parent=parent)


def estimate_request(spec: SpecLike, parent: str) -> jobs_pb2.EstimateJobRequest:
    """The EstimateJobRequest of Jobs.estimate and AsyncJobs.estimate."""
    request = jobs_pb2.EstimateJobRequest(parent=parent)
    request.spec.CopyFrom(load_spec(spec))
    return request


def update_request(name: str, labels: Optional[Mapping[str, str]], priority: Optional[int],
                   display_name: Optional[str]) -> jobs_pb2.UpdateJobRequest:
    """The UpdateJobRequest of Jobs.update and AsyncJobs.update: the fields given, and a mask of them."""
    request = jobs_pb2.UpdateJobRequest()
    request.job.name = name
    if labels is not None:
        request.job.labels.update(dict(labels))
        request.update_mask.paths.append("labels")
    if priority is not None:
        request.job.priority = priority
        request.update_mask.paths.append("priority")
    if display_name is not None:
        request.job.spec.display_name = display_name
        request.update_mask.paths.append("spec.display_name")
    if not request.update_mask.paths:
        raise ValueError("update: give labels, priority or display_name")
    return request
