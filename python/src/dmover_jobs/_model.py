"""The API's objects as Python dataclasses (docs/openapi.json, components/schemas)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

#: A job's states; the last three are ends.
STATES = ("queued", "running", "done", "failed", "cancelled")
END_STATES = frozenset(("done", "failed", "cancelled"))
#: How the data goes between the two servers.
ROUTES = ("push", "pull", "via-service")


@dataclass(frozen=True)
class SyncOptions:
    """A sync job's options (``dmover sync``'s): the destination mirrors the source."""

    delete: bool = False
    max_delete: Optional[int] = None
    checksum: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SyncOptions":
        return cls(
            delete=bool(d.get("delete", False)),
            max_delete=d.get("max_delete"),
            checksum=bool(d.get("checksum", False)),
        )

    def to_dict(self) -> Dict[str, Any]:
        return {"delete": self.delete, "max_delete": self.max_delete, "checksum": self.checksum}


@dataclass(frozen=True)
class JobOptions:
    """The transfer's options (a subset of ``dmover cp``'s). ``filters`` are
    ``(include, pattern)`` pairs in order (rsync's patterns); ``sync`` makes the job a
    sync; ``priority`` (1 to 5, None: 3) orders the owner's own queue; ``notify`` is a
    webhook URL the job's record is POSTed to each time it ends (under the service's
    ``[jobs] webhooks``); ``every_secs`` makes a sync recur (at least 60)."""

    streams: Optional[int] = None
    continue_on_error: bool = False
    verify: bool = False
    route: str = "push"
    sync: Optional[SyncOptions] = None
    filters: Tuple[Tuple[bool, str], ...] = ()
    priority: Optional[int] = None
    notify: Optional[str] = None
    every_secs: Optional[int] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "JobOptions":
        sync = d.get("sync")
        return cls(
            streams=d.get("streams"),
            continue_on_error=bool(d.get("continue_on_error", False)),
            verify=bool(d.get("verify", False)),
            route=str(d.get("route", "push")),
            sync=SyncOptions.from_dict(sync) if isinstance(sync, Mapping) else None,
            filters=tuple(
                (bool(f["include"]), str(f["pattern"])) for f in d.get("filters") or ()
            ),
            priority=d.get("priority"),
            notify=d.get("notify"),
            every_secs=d.get("every_secs"),
        )

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "streams": self.streams,
            "continue_on_error": self.continue_on_error,
            "verify": self.verify,
            "route": self.route,
            "sync": self.sync.to_dict() if self.sync is not None else None,
            "filters": [{"include": i, "pattern": p} for i, p in self.filters],
            "priority": self.priority,
        }
        # Only when set: a service older than webhooks refuses the field.
        if self.notify is not None:
            d["notify"] = self.notify
        if self.every_secs is not None:
            d["every_secs"] = self.every_secs
        return d


@dataclass(frozen=True)
class JobSpec:
    """What a job copies: sources on one server, a destination on a server."""

    sources: List[str]
    destination: str
    options: JobOptions = field(default_factory=JobOptions)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "JobSpec":
        return cls(
            sources=list(d["sources"]),
            destination=str(d["destination"]),
            options=JobOptions.from_dict(d.get("options") or {}),
        )


@dataclass(frozen=True)
class FileError:
    """A file a job's last run could not copy, and why."""

    path: str
    error: str


@dataclass(frozen=True)
class Job:
    """A job as the API shows it. Times are Unix milliseconds."""

    id: int
    owner: str
    kind: str
    state: str
    spec: JobSpec
    attempts: int
    tries: int
    created_ms: int
    queued_ms: int
    started_ms: Optional[int]
    ended_ms: Optional[int]
    not_before_ms: int
    bytes: int
    bytes_total: int
    bytes_resumed: int
    files_done: int
    files_failed: int
    files_total: int
    rate: float
    error: Optional[str]
    file_errors: List[FileError]
    cancel_requested: bool
    #: 1 to 5, as scheduled (the options' priority, else 3).
    priority: int = 3
    #: ``HOST:PORT -> HOST:PORT``: jobs on one link share its limit.
    link: str = ""
    #: Its webhook after its last end: ``pending``, ``delivered``, ``failed`` (None: it
    #: names none, or has not ended).
    webhook: Optional[str] = None
    #: Why its webhook was not delivered.
    webhook_error: Optional[str] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Job":
        """A job from the API's JSON (fields this version does not know are ignored)."""
        return cls(
            id=int(d["id"]),
            owner=str(d["owner"]),
            kind=str(d["kind"]),
            state=str(d["state"]),
            spec=JobSpec.from_dict(d["spec"]),
            attempts=int(d["attempts"]),
            tries=int(d["tries"]),
            created_ms=int(d["created_ms"]),
            queued_ms=int(d["queued_ms"]),
            started_ms=d.get("started_ms"),
            ended_ms=d.get("ended_ms"),
            not_before_ms=int(d["not_before_ms"]),
            bytes=int(d["bytes"]),
            bytes_total=int(d["bytes_total"]),
            bytes_resumed=int(d["bytes_resumed"]),
            files_done=int(d["files_done"]),
            files_failed=int(d["files_failed"]),
            files_total=int(d["files_total"]),
            rate=float(d["rate"]),
            error=d.get("error"),
            file_errors=[FileError(str(f["path"]), str(f["error"])) for f in d["file_errors"]],
            cancel_requested=bool(d["cancel_requested"]),
            priority=int(d.get("priority", 3)),
            link=str(d.get("link", "")),
            webhook=d.get("webhook"),
            webhook_error=d.get("webhook_error"),
        )

    @property
    def ended(self) -> bool:
        """Whether the job is done, failed or cancelled."""
        return self.state in END_STATES

    @property
    def fraction(self) -> Optional[float]:
        """Bytes copied of the total, 0 to 1 (None while the total is not known)."""
        if self.bytes_total <= 0:
            return 1.0 if self.state == "done" else None
        return min(1.0, self.bytes / self.bytes_total)


@dataclass(frozen=True)
class Page:
    """A page of jobs, newest first; ``next`` is the ``before`` of the next page."""

    jobs: List[Job]
    next: Optional[int]
