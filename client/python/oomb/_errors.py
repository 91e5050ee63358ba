"""Typed exceptions: gRPC status codes as Python classes, and a job's failure.

Every RPC failure surfaces as an `OombError` subclass chosen by its status code, with

  - `code`: the `grpc.StatusCode` (None for errors raised before any call was made);
  - `message`: the server's message (the daemon's messages name the field or file at fault:
    "spec: training.learning_rate: must be > 0, got -1");
  - `field`: the request field at fault, when it can be told: from a google.rpc.BadRequest in
    the status details when the server sends one (and googleapis-common-protos is installed),
    else from the message's leading field path (the daemon's convention,
    server/grpc_status.h: "spec: data.train: ..." gives "spec.data.train"); None otherwise;
  - `reason`: a stable machine-readable reason, from a google.rpc.ErrorInfo in the status
    details when the server sends one (for a failed job: JobError.reason); None otherwise.

The original `grpc.RpcError` is the exception's `__cause__`.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Type

import grpc

if TYPE_CHECKING:  # pragma: no cover
    from oomb._job import _JobBase

__all__ = [
    "OombError", "InvalidArgument", "NotFound", "AlreadyExists", "PermissionDenied", "Unauthenticated",
    "ResourceExhausted", "FailedPrecondition", "Unavailable", "DeadlineExceeded", "Cancelled", "Internal",
    "WaitTimeout", "JobFailed", "JobCancelled", "from_rpc_error",
]


class OombError(Exception):
    """Base of every error this SDK raises for the server's (or the spec's) sake."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, reason: Optional[str] = None,
                 field: Optional[str] = None) -> None:
        super().__init__(message)
        self.message: str = message
        self.code: Optional[grpc.StatusCode] = code
        self.reason: Optional[str] = reason
        self.field: Optional[str] = field

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}" if self.code is not None else self.message


class InvalidArgument(OombError):
    """INVALID_ARGUMENT: a bad spec, dataset or request field (`field` names it when known)."""


class NotFound(OombError):
    """NOT_FOUND: no such job."""


class AlreadyExists(OombError):
    """ALREADY_EXISTS: CreateJob with a job_id that is taken."""


class PermissionDenied(OombError):
    """PERMISSION_DENIED."""


class Unauthenticated(OombError):
    """UNAUTHENTICATED: a missing or wrong bearer token."""


class ResourceExhausted(OombError):
    """RESOURCE_EXHAUSTED: the job does not fit the server (the message names the limit), or a quota."""


class FailedPrecondition(OombError):
    """FAILED_PRECONDITION: the job's state does not allow the call (e.g. cancel a finished job)."""


class Unavailable(OombError):
    """UNAVAILABLE: the server is not reachable or is draining; retried by the client first."""


class DeadlineExceeded(OombError):
    """DEADLINE_EXCEEDED: the call's deadline passed."""


class Cancelled(OombError):
    """CANCELLED: the call was cancelled."""


class Internal(OombError):
    """INTERNAL (or UNKNOWN, DATA_LOSS): a server-side bug or corruption."""


class WaitTimeout(DeadlineExceeded, TimeoutError):
    """`Job.wait(timeout=...)` ran out of time before the job ended (also a `TimeoutError`)."""


class JobFailed(OombError):
    """A waited-for job ended FAILED. `job` is the final Job; `code`/`reason`/`message` its JobError."""

    def __init__(self, job: "_JobBase") -> None:
        err = job.proto.error
        code = getattr(grpc.StatusCode, err.code, None) if err.code else None
        text = f"job {job.name} FAILED" + (f": {err.reason}" if err.reason else "") + (
            f": {err.message}" if err.message else "")
        super().__init__(text, code=code, reason=err.reason or None)
        self.message = err.message
        self.job = job

    def __str__(self) -> str:
        return self.args[0]


class JobCancelled(OombError):
    """A waited-for job ended CANCELLED. `job` is the final Job."""

    def __init__(self, job: "_JobBase") -> None:
        super().__init__(f"job {job.name} CANCELLED", code=grpc.StatusCode.CANCELLED, reason="CANCELLED")
        self.job = job

    def __str__(self) -> str:
        return self.message


_BY_CODE: Dict[grpc.StatusCode, Type[OombError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Internal,
    grpc.StatusCode.DATA_LOSS: Internal,
}

# A field path: "spec", "data.train", "lora.target_modules[2]".
_FIELD = r"[a-z_][a-z0-9_]*(?:\[[0-9]+\])?(?:\.[a-z_][a-z0-9_]*(?:\[[0-9]+\])?)*"
_LEADING_FIELD = re.compile(rf"({_FIELD}): ")


def leading_field(message: str) -> Optional[str]:
    """The dotted field path a daemon message starts with ("spec: data.train: ..." -> "spec.data.train")."""
    parts = []
    rest = message
    while True:
        m = _LEADING_FIELD.match(rest)
        if m is None:
            break
        parts.append(m.group(1))
        rest = rest[m.end():]
    return ".".join(parts) or None


def _status_details(error: Any) -> Tuple[Optional[str], Optional[str]]:
    """(reason, field) from google.rpc.Status details in the trailers, when present and decodable."""
    try:
        trailers = error.trailing_metadata() or ()
    except Exception:  # pragma: no cover - an RpcError without trailers
        return None, None
    blob = None
    for key, value in trailers:
        if key == "grpc-status-details-bin":
            blob = value
    if not blob:
        return None, None
    try:  # googleapis-common-protos: optional; the daemon sends no details today
        from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-not-found]
    except ImportError:
        return None, None
    reason = field = None
    try:
        status = status_pb2.Status.FromString(blob)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = reason or info.reason or None
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                if bad.field_violations:
                    field = field or bad.field_violations[0].field or None
    except Exception:  # a malformed payload: fall back to the message
        return None, None
    return reason, field


def from_rpc_error(error: grpc.RpcError) -> OombError:
    """The typed exception for a failed gRPC call (grpc.RpcError or grpc.aio.AioRpcError)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    message = (error.details() if hasattr(error, "details") else str(error)) or ""  # type: ignore[attr-defined]
    reason, field = _status_details(error)
    if field is None:
        field = leading_field(message)
    cls = _BY_CODE.get(code, OombError)
    return cls(message, code=code, reason=reason, field=field)
