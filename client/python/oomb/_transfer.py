"""Data in, models out: uploaded datasets (`client.datasets`) and checkpoint downloads.

Uploads stream the file in 1 MiB messages (DatasetService.UploadDataset) with its SHA-256 and
size, so the server refuses what arrives damaged. The id defaults to "ds-" and the first 12 hex
digits of the SHA-256 (the file hashed before it is sent): an upload retried after a lost answer
(UNAVAILABLE) finds the dataset the first one made instead of making another. A named upload
(dataset_id) hashes the file as it sends it and sends the hash last: the file is read once.

Downloads (JobService.DownloadCheckpoint) unpack the checkpoint's tar stream into `dir` as it
arrives (its files flat, as the checkpoint directory holds them: `PeftModel.from_pretrained(dir)`
loads an adapter), each file's CRC-32 checked against the checkpoint's manifest; a stream cut off
(the server restarting or draining, the network) resumes from the entry it was in, by the same
call (with backoff) or by calling again with the same directory (`<dir>/.oomb-download`).
"""
from __future__ import annotations

import datetime
import hashlib
import os
import queue
import tarfile
import threading
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
STATE = ".oomb-download"
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


def upload_plan(path: Path, dataset_id: Optional[str], display_name: Optional[str],
                parent_name: str) -> "tuple[datasets_pb2.UploadDatasetRequest, bool]":
    """The first message's fields but its data, and whether the file is hashed as it is sent: the
    default id is made of the SHA-256, so the file is hashed first; a named upload reads it once,
    its hash in a last message."""
    if dataset_id:
        return upload_header(path, "", path.stat().st_size, dataset_id, display_name, parent_name), True
    return upload_header(path, *file_sha256(path), None, display_name, parent_name), False


class _Hasher:
    """SHA-256 on a thread of its own (hashlib releases the GIL), fed the chunks being sent."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._queue: "queue.Queue[Optional[bytes]]" = queue.Queue(maxsize=8)
        self._thread = threading.Thread(target=self._run, name="oomb-upload-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self._sha.update(chunk)

    def update(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def hexdigest(self) -> str:
        self.close()
        return self._sha.hexdigest()

    def close(self) -> None:
        """Stops the thread once it has hashed what it was given (again: nothing)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


def upload_messages(path: Path, header: datasets_pb2.UploadDatasetRequest,
                    hash_late: bool) -> Iterator[datasets_pb2.UploadDatasetRequest]:
    """The upload stream: the header with the first chunk, the rest of the file in 1 MiB messages,
    then (hash_late) the file's SHA-256 alone, computed beside the sending."""
    h = _Hasher() if hash_late else None
    try:
        with open(path, "rb") as f:
            chunk = f.read(CHUNK)
            while True:
                if h is not None:
                    h.update(chunk)
                yield upload_message(header, chunk)
                header = None  # type: ignore[assignment]
                chunk = f.read(CHUNK)
                if not chunk:
                    break
        if h is not None:
            yield datasets_pb2.UploadDatasetRequest(sha256=h.hexdigest())
    finally:
        if h is not None:
            h.close()  # the stream may have ended early


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
        header, hash_late = upload_plan(path, dataset_id, display_name, self._client._parent(project))

        def messages() -> Iterator[datasets_pb2.UploadDatasetRequest]:
            return upload_messages(path, header, hash_late)

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


class _ArchiveBytes:
    """A stream's archive bytes as the file `tarfile` reads in stream mode ("r|")."""

    def __init__(self, messages: Iterator[jobs_pb2.DownloadCheckpointResponse]) -> None:
        self._messages = messages
        self._buf = memoryview(b"")

    def read(self, size: int = -1) -> bytes:
        while not self._buf:
            message = next(self._messages, None)
            if message is None:
                return b""
            self._buf = memoryview(message.data)
        n = len(self._buf) if size < 0 else min(size, len(self._buf))
        out, self._buf = self._buf[:n].tobytes(), self._buf[n:]
        return out


class _FileWriter:
    """Writes an archive's files on a thread of its own while the stream is read (file writes,
    fsync and CRC-32 release the GIL), behind a queue of at most 16 blocks: each file to
    `.NAME.part`, its CRC-32 checked, fsynced, renamed. A file begins only when the one before it
    is in place; the download's state moves to it then. The first error stops the writing and is
    raised to the reader at its next call."""

    def __init__(self, download: "Download") -> None:
        self._download = download
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=16)
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="oomb-download-writer", daemon=True)
        self._thread.start()

    def begin(self, name: str, crc: int, offset: int) -> None:
        """The entry at `offset` of the archive, file `name` with that CRC-32 (0: unchecked)."""
        self._put(("begin", name, crc, offset))

    def write(self, block: bytes) -> None:
        self._put(block)

    def end(self) -> None:
        self._put(("end",))

    def close(self, abort: bool = False) -> None:
        """Waits for the writing to end (a file begun and not ended is removed); raises its error
        unless `abort`."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None and not abort:
            raise self.error

    def _put(self, item: Any) -> None:
        if self.error is not None:
            raise self.error
        self._queue.put(item)

    def _run(self) -> None:
        out, tmp, crc, name, want = None, None, 0, "", 0
        directory = self._download.directory
        while (item := self._queue.get()) is not None:
            if self.error is not None:
                continue  # consumed, so that the reader never waits on a full queue
            try:
                if isinstance(item, bytes):
                    crc = zlib.crc32(item, crc)
                    out.write(item)  # type: ignore[union-attr]
                elif item[0] == "begin":
                    _, name, want, offset = item
                    self._download.offset = offset
                    self._download._save_state()
                    tmp, crc = directory / f".{name}.part", 0
                    out = open(tmp, "wb")
                else:
                    out.flush()  # type: ignore[union-attr]
                    os.fsync(out.fileno())  # type: ignore[union-attr]
                    out.close()  # type: ignore[union-attr]
                    out = None
                    if want and crc != want:
                        raise InvalidArgument(f"{name}: CRC-32 {crc:08x}, the checkpoint's manifest says {want:08x}")
                    tmp.replace(directory / name)  # type: ignore[union-attr]
                    tmp = None
            except BaseException as e:  # noqa: B036 - handed to the reader
                self.error = e
        if out is not None:
            out.close()
        if tmp is not None:
            tmp.unlink(missing_ok=True)


class Download:
    """One checkpoint download into a directory, attempt by attempt (download_checkpoint runs it;
    the asyncio client runs it with its own stream). Each attempt's stream is unpacked as it
    arrives (_FileWriter): every file written once, to `.NAME.part`, its CRC-32 checked against
    the manifest, fsynced, then renamed. `<dir>/.oomb-download` keeps the archive's etag and the offset of the
    first entry not yet unpacked, so an attempt resumes there, as does a later call with the same
    directory. After a failed attempt, `retry_after` says whether and when to try again."""

    def __init__(self, name: str, directory: Union[str, os.PathLike], attempts: int = 6) -> None:
        self.name, self.directory, self.attempts = name, Path(directory), attempts
        self.directory.mkdir(parents=True, exist_ok=True)
        self.state_file = self.directory / STATE
        self.archive = jobs_pb2.CheckpointArchive()
        self.etag, self.offset = "", 0
        try:
            etag, offset = self.state_file.read_text().split()
            self.etag, self.offset = etag, max(0, int(offset))
        except (OSError, ValueError):
            pass

    def request(self) -> jobs_pb2.DownloadCheckpointRequest:
        return jobs_pb2.DownloadCheckpointRequest(name=self.name, offset=self.offset,
                                                  etag=self.etag if self.offset else "")

    def unpack(self, messages: Iterator[jobs_pb2.DownloadCheckpointResponse]) -> None:
        """One attempt: unpacks the stream of `request()` (its description first). A stream that
        breaks off raises its grpc.RpcError, the state at the entry it was in."""
        first = next(messages, None)
        if first is None or not first.HasField("archive"):
            raise InvalidArgument("the download stream did not begin with the archive's description")
        self.archive.CopyFrom(first.archive)
        self.etag = first.archive.etag
        crcs = {f.path: f.crc32 for f in self.archive.files}
        prefix, start = self.archive.root + "/", self.offset
        writer = _FileWriter(self)
        try:
            with tarfile.open(fileobj=_ArchiveBytes(messages), mode="r|", bufsize=CHUNK) as tar:  # type: ignore
                for member in tar:
                    if member.name.rstrip("/") == self.archive.root and member.isdir():
                        continue
                    name = member.name[len(prefix):] if member.name.startswith(prefix) else ""
                    if not name or "/" in name or name in (".", "..") or name not in crcs or not member.isfile():
                        raise InvalidArgument(f"unexpected entry in the checkpoint archive: {member.name!r}")
                    source = tar.extractfile(member)
                    assert source is not None
                    writer.begin(name, crcs[name], start + member.offset)
                    while block := source.read(CHUNK):
                        writer.write(block)
                    writer.end()
        except BaseException:
            writer.close(abort=True)
            raise
        writer.close()
        missing = sorted(n for n in crcs if not (self.directory / n).is_file())
        if missing:
            raise InvalidArgument(f"the checkpoint archive ended without {', '.join(missing)}")

    def _save_state(self) -> None:
        tmp = self.state_file.with_name(STATE + ".tmp")
        tmp.write_text(f"{self.etag}\n{self.offset}\n")
        tmp.replace(self.state_file)

    def retry_after(self, e: grpc.RpcError, attempt: int) -> float:
        """Seconds to wait before the next attempt after `e`; raises the typed error when none is left."""
        code = e.code()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.ABORTED and self.offset:  # the checkpoint changed: start over
            self.offset, self.etag = 0, ""
            return 0.0
        if code not in _RESUMABLE or attempt + 1 == self.attempts:
            raise from_rpc_error(e) from e
        return 0.25 * 2 ** attempt

    def finish(self) -> Path:
        self.state_file.unlink(missing_ok=True)
        return self.directory


def download_checkpoint(client: "Client", name: str, directory: Union[str, os.PathLike],
                        attempts: int = 6) -> Path:
    """Downloads the checkpoint `name` (`projects/p/jobs/j/checkpoints/{step|final}`) into
    `directory` (created); resumes a download cut off there before. Returns the directory."""
    d = Download(name, directory, attempts)
    for attempt in range(attempts):
        call = client.stub.DownloadCheckpoint(d.request(), metadata=client.metadata)
        try:
            d.unpack(iter(call))
            break
        except grpc.RpcError as e:
            time.sleep(d.retry_after(e, attempt))
        finally:
            call.cancel()
    return d.finish()
