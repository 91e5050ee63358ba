"""Data in, models out: uploaded datasets (`client.datasets`) and checkpoint downloads.

Uploads stream the file in 1 MiB messages (DatasetService.UploadDataset) with its SHA-256 and
size, computed first, so the server refuses what arrives damaged. The id defaults to "ds-" and the
first 12 hex digits of the SHA-256: an upload retried after a lost answer (UNAVAILABLE) finds the
dataset the first one made instead of making another.

Downloads (JobService.DownloadCheckpoint) append the checkpoint's tar stream to
`<dir>/.oomb-download.tar` (its etag beside it); a stream cut off (the server restarting or
draining, the network) resumes from the bytes already there, by the same call (with backoff) or by
calling again with the same directory. The complete archive is unpacked into `dir` (its files
flat, as the checkpoint directory holds them: `PeftModel.from_pretrained(dir)` loads an adapter),
each file's CRC-32 checked against the checkpoint's manifest.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Union

import grpc

from oomb._errors import InvalidArgument, from_rpc_error
from oomb._names import parent
from oomb.v1 import datasets_pb2, jobs_pb2

if TYPE_CHECKING:  # pragma: no cover
    from oomb._client import Client

__all__ = ["Dataset", "Datasets", "Download", "dataset_name", "download_checkpoint"]

CHUNK = 1 << 20
PARTIAL = ".oomb-download.tar"
ETAG = ".oomb-download.etag"
_RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL})


def dataset_name(name_or_id: str, project: Optional[str] = None) -> str:
    """A dataset's resource name from its id (`austen`), `datasets/{id}` or a full name."""
    if name_or_id.startswith("projects/"):
        return name_or_id
    did = name_or_id[len("datasets/"):] if name_or_id.startswith("datasets/") else name_or_id
    return f"{parent(project)}/datasets/{did}" if project else f"datasets/{did}"


@dataclass(frozen=True)
class Dataset:
    """An uploaded dataset. A job names it in data.train / data.validation as `spec_name`."""

    name: str
    display_name: str
    size_bytes: int
    sha256: str
    records: int
    record_kinds: Dict[str, int]
    creator: str
    create_time: Optional[datetime.datetime]
    proto: datasets_pb2.Dataset

    @property
    def id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def spec_name(self) -> str:
        """`datasets/{id}`: how a job of its project names it."""
        return f"datasets/{self.id}"

    @classmethod
    def from_proto(cls, d: datasets_pb2.Dataset) -> "Dataset":
        created = None
        if d.create_time.seconds or d.create_time.nanos:
            created = d.create_time.ToDatetime(tzinfo=datetime.timezone.utc)
        return cls(name=d.name, display_name=d.display_name, size_bytes=d.size_bytes, sha256=d.sha256,
                   records=d.records, record_kinds=dict(d.record_kinds), creator=d.creator, create_time=created,
                   proto=d)


def file_sha256(path: Path) -> "tuple[str, int]":
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def upload_header(path: Path, sha: str, size: int, dataset_id: Optional[str], display_name: Optional[str],
                  parent_name: str) -> datasets_pb2.UploadDatasetRequest:
    """The first UploadDatasetRequest's fields but its data (Datasets.upload's defaults)."""
    return datasets_pb2.UploadDatasetRequest(
        parent=parent_name, dataset_id=dataset_id or f"ds-{sha[:12]}",
        display_name=display_name if display_name is not None else path.name, sha256=sha, size_bytes=size)


def upload_message(header: Optional[datasets_pb2.UploadDatasetRequest],
                   chunk: bytes) -> datasets_pb2.UploadDatasetRequest:
    """One message of the upload stream: the header's fields (the first) and a chunk of the file."""
    message = datasets_pb2.UploadDatasetRequest()
    if header is not None:
        message.CopyFrom(header)
    message.data = chunk
    return message


class Datasets:
    """`client.datasets`: the DatasetService calls (proto/oomb/v1/datasets.proto)."""

    def __init__(self, client: "Client") -> None:
        self._client = client
        from oomb.v1 import datasets_pb2_grpc

        self.stub = datasets_pb2_grpc.DatasetServiceStub(client.channel)

    def upload(self, path: Union[str, os.PathLike], dataset_id: Optional[str] = None,
               display_name: Optional[str] = None, project: Optional[str] = None,
               attempts: int = 4) -> Dataset:
        """Uploads a JSONL file; returns the Dataset once the server checked every line.

        Args:
          path: the file.
          dataset_id: its id ([a-z0-9][a-z0-9-]{0,62}); default "ds-" and the start of its SHA-256.
          display_name: default the file's name.
          project: as in jobs.create.
          attempts: tries when the server is unreachable (the upload starts over; the same id and
            content make a retry harmless).

        Raises:
          InvalidArgument (a bad line, named by number), AlreadyExists (the id holds other
          content), ResourceExhausted (the project's max_storage_bytes), ...
        """
        path = Path(path)
        first = upload_header(path, *file_sha256(path), dataset_id, display_name, self._client._parent(project))

        def messages() -> Iterator[datasets_pb2.UploadDatasetRequest]:
            with open(path, "rb") as f:
                chunk = f.read(CHUNK)
                yield upload_message(first, chunk)
                while chunk := f.read(CHUNK):
                    yield upload_message(None, chunk)

        for attempt in range(attempts):
            try:
                return Dataset.from_proto(self.stub.UploadDataset(messages(), metadata=self._client.metadata))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt + 1 == attempts:  # type: ignore[attr-defined]
                    raise from_rpc_error(e) from e
                time.sleep(0.5 * 2 ** attempt)
        raise AssertionError("unreachable")

    def get(self, name_or_id: str, timeout: Optional[float] = None) -> Dataset:
        """The dataset (GetDataset): an id of the client's project, `datasets/{id}` or a full name."""
        request = datasets_pb2.GetDatasetRequest(name=dataset_name(name_or_id, self._client.project))
        return Dataset.from_proto(self._call("GetDataset", request, timeout))

    def list(self, project: Optional[str] = None, all_projects: bool = False, page_size: Optional[int] = None,
             timeout: Optional[float] = None) -> Iterator[Dataset]:
        """Every dataset, newest first, page after page (ListDatasets)."""
        request = datasets_pb2.ListDatasetsRequest(parent=self._client._parent(project, all_projects),
                                                   page_size=page_size or 0)
        while True:
            response = self._call("ListDatasets", request, timeout)
            for d in response.datasets:
                yield Dataset.from_proto(d)
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    def delete(self, name_or_id: str, timeout: Optional[float] = None) -> None:
        """Deletes the dataset and its file (DeleteDataset); jobs naming it that have not read it
        yet fail with NOT_FOUND."""
        request = datasets_pb2.DeleteDatasetRequest(name=dataset_name(name_or_id, self._client.project))
        self._call("DeleteDataset", request, timeout)

    def _call(self, method: str, request: Any, timeout: Optional[float]) -> Any:
        from oomb._retry import IDEMPOTENT, call_with_retry

        def attempt(_: int) -> Any:
            return getattr(self.stub, method)(request, timeout=self._client._deadline(timeout),
                                              metadata=self._client.metadata)

        try:
            return call_with_retry(attempt, self._client.retry, IDEMPOTENT, method)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e


def _unpack(partial: Path, directory: Path, archive: jobs_pb2.CheckpointArchive) -> None:
    """Unpacks the archive's files (its top directory stripped) into `directory`, CRC-32 checked."""
    crcs = {f.path: f.crc32 for f in archive.files}
    prefix = archive.root + "/"
    with tarfile.open(partial, "r:") as tar:
        for member in tar:
            if member.name.rstrip("/") == archive.root and member.isdir():
                continue
            name = member.name[len(prefix):] if member.name.startswith(prefix) else ""
            if not name or "/" in name or name in (".", "..") or name not in crcs or not member.isfile():
                raise InvalidArgument(f"unexpected entry in the checkpoint archive: {member.name!r}")
            source = tar.extractfile(member)
            assert source is not None
            target = directory / name
            tmp = directory / f".{name}.part"
            crc = 0
            with open(tmp, "wb") as out:
                while block := source.read(CHUNK):
                    crc = zlib.crc32(block, crc)
                    out.write(block)
            if crcs[name] and crc != crcs[name]:
                tmp.unlink()
                raise InvalidArgument(f"{name}: CRC-32 {crc:08x}, the checkpoint's manifest says {crcs[name]:08x}")
            tmp.replace(target)


class Download:
    """One checkpoint download into a directory, call by call (download_checkpoint runs it; the
    asyncio client runs it with its own stream): each attempt's request resumes from the bytes
    already in the partial archive; after a failed attempt, `retry_after` says whether and when to
    try again; `finish` unpacks the complete archive."""

    def __init__(self, name: str, directory: Union[str, os.PathLike], attempts: int = 6) -> None:
        self.name, self.directory, self.attempts = name, Path(directory), attempts
        self.directory.mkdir(parents=True, exist_ok=True)
        self.partial, self.etag_file = self.directory / PARTIAL, self.directory / ETAG
        self.archive = jobs_pb2.CheckpointArchive()
        self.offset = 0

    def request(self) -> jobs_pb2.DownloadCheckpointRequest:
        self.offset = self.partial.stat().st_size if self.partial.exists() else 0
        etag = self.etag_file.read_text().strip() if self.offset and self.etag_file.exists() else ""
        return jobs_pb2.DownloadCheckpointRequest(name=self.name, offset=self.offset, etag=etag)

    def accept(self, message: jobs_pb2.DownloadCheckpointResponse, out: Any) -> None:
        """One streamed message: the archive's description, or bytes appended to `out`."""
        if message.HasField("archive"):
            self.archive.CopyFrom(message.archive)
        else:
            out.write(message.data)

    def ended(self) -> None:
        """After an attempt, done or failed: the archive's etag kept for the next one."""
        if self.archive.etag:
            self.etag_file.write_text(self.archive.etag + "\n")

    def retry_after(self, e: grpc.RpcError, attempt: int) -> float:
        """Seconds to wait before the next attempt after `e`; raises the typed error when none is left."""
        code = e.code()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.ABORTED and self.offset:  # the checkpoint changed: start over
            self.partial.unlink()
            return 0.0
        if code not in _RESUMABLE or attempt + 1 == self.attempts:
            raise from_rpc_error(e) from e
        return 0.25 * 2 ** attempt

    def finish(self) -> Path:
        have = self.partial.stat().st_size if self.partial.exists() else 0
        if have != self.archive.total_bytes:
            raise InvalidArgument(
                f"the archive has {have} of its {self.archive.total_bytes} bytes; call again to resume")
        _unpack(self.partial, self.directory, self.archive)
        self.partial.unlink()
        self.etag_file.unlink(missing_ok=True)
        return self.directory


def download_checkpoint(client: "Client", name: str, directory: Union[str, os.PathLike],
                        attempts: int = 6) -> Path:
    """Downloads the checkpoint `name` (`projects/p/jobs/j/checkpoints/{step|final}`) into
    `directory` (created); resumes a download cut off there before. Returns the directory."""
    d = Download(name, directory, attempts)
    for attempt in range(attempts):
        call = client.stub.DownloadCheckpoint(d.request(), metadata=client.metadata)
        try:
            with open(d.partial, "ab") as out:
                for message in call:
                    d.accept(message, out)
                out.flush()
                os.fsync(out.fileno())
            d.ended()
            break
        except grpc.RpcError as e:
            d.ended()
            time.sleep(d.retry_after(e, attempt))
        finally:
            call.cancel()
    return d.finish()
