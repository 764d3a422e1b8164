"""A client of a dmover job service's REST API, on the standard library only."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import http.client
import json
import os
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple, Union

from ._model import Job, JobOptions, Page, SyncOptions

PathLike = Union[str, "os.PathLike[str]"]


class Error(Exception):
    """Anything that kept a request from getting its answer."""


class APIError(Error):
    """The service answered with an error: its HTTP status, ``code`` and ``message``.

    ``code`` is one of ``bad_request`` (400), ``unauthorized`` (401), ``not_found``
    (404, also another user's job), ``conflict`` (409), ``internal`` (500).
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"the job service refused: {message} (HTTP {status}, {code})")
        self.status = status
        self.code = code
        self.message = message


class UnreachableError(Error):
    """The service could not be reached, or the exchange broke."""


class TrustError(Error):
    """An https:// service's key is not the one pinned (or its CA does not vouch for it)."""


class WaitTimeout(Error, TimeoutError):
    """:meth:`Client.wait` gave up; ``job`` is the last state seen."""

    def __init__(self, job: Job, timeout: float) -> None:
        super().__init__(f"job {job.id} is still {job.state} after {timeout:g} s")
        self.job = job


def spki_fingerprint(der_cert: bytes) -> str:
    """A certificate's key fingerprint as dmover prints and pins it: ``sha256:`` and
    the base64 (no padding) of the SHA-256 of its SubjectPublicKeyInfo."""
    spki = _spki_of(der_cert)
    digest = hashlib.sha256(spki).digest()
    return "sha256:" + base64.b64encode(digest).decode().rstrip("=")


def _tlv(buf: bytes, off: int) -> Tuple[int, int, int]:
    """The DER element at ``off``: (tag, start of its content, end)."""
    tag = buf[off]
    n = buf[off + 1]
    off += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(buf[off : off + k], "big")
        off += k
    return tag, off, off + n


def _spki_of(cert: bytes) -> bytes:
    _, tbs_at, _ = _tlv(cert, 0)  # Certificate ::= SEQUENCE
    _, at, _ = _tlv(cert, tbs_at)  # tbsCertificate ::= SEQUENCE
    tag, _, end = _tlv(cert, at)
    if tag == 0xA0:  # [0] version, optional
        at = end
    # serialNumber, signature, issuer, validity, subject, then subjectPublicKeyInfo
    for _ in range(5):
        _, _, at = _tlv(cert, at)
    _, _, end = _tlv(cert, at)
    return cert[at:end]


def default_known_hosts() -> Optional[Path]:
    """The CLI's known-hosts file: ``$XDG_CONFIG_HOME/dmover/known_hosts``, else
    ``$HOME/.config/dmover/known_hosts``."""
    config = os.environ.get("XDG_CONFIG_HOME")
    if config:
        return Path(config) / "dmover" / "known_hosts"
    home = os.environ.get("HOME")
    if home:
        return Path(home) / ".config" / "dmover" / "known_hosts"
    return None


def pin_known_host(path: PathLike, host: str, fingerprint: str) -> bool:
    """Checks ``fingerprint`` for ``host`` (``HOST:PORT``) against the known-hosts file
    as the CLI does: a new host is added (True), a known one must match (False), a
    changed key raises :class:`TrustError`. The file is locked while read and written."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        for i, line in enumerate(text.splitlines(), 1):
            words = line.split()
            if not words or words[0].startswith("#") or len(words) < 2:
                continue
            if words[0] == host:
                if words[1] == fingerprint:
                    return False
                raise TrustError(
                    f"the job service {host} presented key {fingerprint}, but {path} line {i} "
                    f"pins {words[1]}: if the key was changed on purpose, remove that line"
                )
        add = "" if not text or text.endswith("\n") else "\n"
        f.write(f"{add}{host} {fingerprint}\n")
        f.flush()
        os.fsync(f.fileno())
        return True


class Client:
    """A client of one dmover job service (``dmover serve --jobs``).

    ``url`` is ``http://HOST:PORT`` (loopback) or ``https://HOST:PORT``; default the
    ``DMOVER_SERVICE`` environment variable. The bearer token is ``token``, else the
    content of ``token_file``, else ``DMOVER_TOKEN`` (as the CLI's ``--token-file`` and
    ``DMOVER_TOKEN``).

    An ``https://`` service presents the dmover server's own key. Trust it with one of:

    - ``fingerprint="sha256:..."``: exactly that key (the ``dmover: key fingerprint``
      line the server prints at start);
    - ``ca_file=PATH``: a CA that signed the server's certificate (``--tls-cert``),
      checked with the host name, as the CLI's ``--ca``;
    - otherwise ``known_hosts`` (default: the CLI's file,
      ``~/.config/dmover/known_hosts``): pinned on first use under ``HOST:PORT``,
      refused if it changes, the same file and lines as ``dmover submit`` uses.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        token_file: Optional[PathLike] = None,
        *,
        fingerprint: Optional[str] = None,
        ca_file: Optional[PathLike] = None,
        known_hosts: Optional[PathLike] = None,
        timeout: float = 30.0,
    ) -> None:
        url = url or os.environ.get("DMOVER_SERVICE")
        if not url:
            raise ValueError("no job service URL: pass url= or set DMOVER_SERVICE")
        parts = urllib.parse.urlsplit(url)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
        ):
            raise ValueError(
                f"job service URL {url!r}: expected http://HOST:PORT (loopback) or https://HOST:PORT"
            )
        self.url = url.rstrip("/")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._authority = parts.netloc
        if token is None and token_file is not None:
            token = Path(token_file).read_text(encoding="utf-8")
        if token is None:
            token = os.environ.get("DMOVER_TOKEN")
        if token is not None:
            token = token.strip()
            if not token:
                raise ValueError("the token is empty")
        self._token = token
        self._timeout = timeout
        self._fingerprint = fingerprint
        self._known_hosts: Optional[Path] = None
        self._context: Optional[ssl.SSLContext] = None
        if self._tls:
            if fingerprint and ca_file:
                raise ValueError("pass fingerprint= or ca_file=, not both")
            if ca_file is not None:
                self._context = ssl.create_default_context(cafile=os.fspath(ca_file))
            else:
                # Trust is the pin, checked right after the handshake (TLS 1.3 still
                # checks that the server holds the key it presents).
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_3
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                self._context = ctx
                if not fingerprint:
                    kh = Path(known_hosts) if known_hosts is not None else default_known_hosts()
                    if kh is None:
                        raise ValueError(
                            "no known-hosts file (neither XDG_CONFIG_HOME nor HOME is set): "
                            "pass known_hosts=, fingerprint= or ca_file="
                        )
                    self._known_hosts = kh

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # The exchange.

    def _connect(self) -> http.client.HTTPConnection:
        try:
            if not self._tls:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
                conn.connect()
                return conn
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._context
            )
            conn.connect()
        except ssl.SSLCertVerificationError as e:
            raise TrustError(f"the job service at {self.url}: {e}") from e
        except OSError as e:
            raise UnreachableError(f"cannot reach the job service at {self.url}: {e}") from e
        if self._context is not None and self._context.verify_mode == ssl.CERT_NONE:
            der = conn.sock.getpeercert(binary_form=True)
            if not der:
                conn.close()
                raise TrustError(f"the job service at {self.url} presented no certificate")
            fp = spki_fingerprint(der)
            if self._fingerprint is not None:
                if fp != self._fingerprint:
                    conn.close()
                    raise TrustError(
                        f"the job service at {self.url} presented key {fp}, not the pinned "
                        f"{self._fingerprint}"
                    )
            elif self._known_hosts is not None:
                try:
                    pin_known_host(self._known_hosts, self._authority, fp)
                except BaseException:
                    conn.close()
                    raise
        return conn

    def request(
        self, method: str, path: str, body: Optional[Any] = None
    ) -> Tuple[int, Any]:
        """One request: the HTTP status and the JSON answer (errors not raised)."""
        headers: Dict[str, str] = {"Host": self._authority, "Accept": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connect()
        try:
            conn.request(method, path, body=data, headers=headers)
            res = conn.getresponse()
            raw = res.read()
            status = res.status
        except (OSError, http.client.HTTPException) as e:
            raise UnreachableError(f"the job service at {self.url}: {e}") from e
        finally:
            conn.close()
        try:
            return status, json.loads(raw)
        except ValueError as e:
            raise Error(
                f"the job service at {self.url} answered HTTP {status}, not JSON: {raw[:200]!r}"
            ) from e

    def _call(self, method: str, path: str, body: Optional[Any] = None) -> Any:
        status, v = self.request(method, path, body)
        if not 200 <= status < 300:
            e = v.get("error") if isinstance(v, dict) else None
            e = e if isinstance(e, dict) else {}
            raise APIError(status, str(e.get("code", "unknown")), str(e.get("message", "(no message)")))
        return v

    # The API.

    def submit(
        self,
        sources: Union[str, Sequence[str]],
        destination: str,
        *,
        streams: Optional[int] = None,
        continue_on_error: bool = False,
        verify: bool = False,
        route: str = "push",
        sync: Optional[SyncOptions] = None,
        exclude: Sequence[str] = (),
        include: Sequence[str] = (),
        priority: Optional[int] = None,
        notify: Optional[str] = None,
        every_secs: Optional[int] = None,
    ) -> Job:
        """Submits a copy of ``sources`` (paths on one server, ``dmover://HOST[:PORT]/PATH``
        or ``HOST:PATH``) into ``destination`` (a path on a server; ending in ``/``: an
        existing directory that receives them). With ``sync``, a sync: one source, and
        ``destination`` its mirror. ``include`` rules come before ``exclude`` ones (for
        another order, pass ``JobOptions.filters`` through :meth:`request`). ``priority``
        (1 to 5) orders your own queue. ``notify``: a webhook URL the job's record is
        POSTed to each time it ends (the service must allow it). ``every_secs`` (with
        ``sync``): run the sync again that long after each run started. Returns the
        job, ``queued``."""
        if isinstance(sources, str):
            sources = [sources]
        filters = tuple((True, p) for p in include) + tuple((False, p) for p in exclude)
        options = JobOptions(
            streams, continue_on_error, verify, route, sync, filters, priority, notify,
            every_secs,
        )
        body = {
            "sources": list(sources),
            "destination": destination,
            "options": options.to_dict(),
        }
        return Job.from_dict(self._call("POST", "/api/v1/jobs", body))

    def job(self, id: int) -> Job:
        """Job ``id``."""
        return Job.from_dict(self._call("GET", f"/api/v1/jobs/{int(id)}"))

    def jobs(self, limit: int = 100, before: Optional[int] = None) -> Page:
        """A page of jobs, newest first: at most ``limit`` (1 to 1000), of ids below
        ``before`` (the previous page's ``next``)."""
        q = {"limit": int(limit)}
        if before is not None:
            q["before"] = int(before)
        v = self._call("GET", "/api/v1/jobs?" + urllib.parse.urlencode(q))
        return Page([Job.from_dict(j) for j in v["jobs"]], v.get("next"))

    def iter_jobs(self, page_size: int = 100) -> Iterator[Job]:
        """Every job the caller may see, newest first, page after page."""
        before: Optional[int] = None
        while True:
            page = self.jobs(limit=page_size, before=before)
            yield from page.jobs
            if page.next is None:
                return
            before = page.next

    def cancel(self, id: int) -> Job:
        """Cancels job ``id``: a queued one ends at once; a running one answers still
        ``running`` with ``cancel_requested`` while its transfer stops."""
        return Job.from_dict(self._call("POST", f"/api/v1/jobs/{int(id)}/cancel"))

    def retry(self, id: int) -> Job:
        """Queues a failed or cancelled job again (its next run resumes)."""
        return Job.from_dict(self._call("POST", f"/api/v1/jobs/{int(id)}/retry"))

    def events(self, id: int) -> Iterator[Job]:
        """Follows job ``id``: yields it as it is now, then again each time its record
        changes (state, counters, errors), until it ends (the last one yielded is the
        ended job). One connection, no polling: the service's event stream
        (``GET /api/v1/jobs/{id}/events``, newline-delimited JSON; its heartbeats are
        skipped). Closing the generator closes the connection."""
        headers: Dict[str, str] = {"Host": self._authority, "Accept": "application/x-ndjson"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        conn = self._connect()
        try:
            # The service sends a heartbeat after 15 s of quiet: wait longer than that.
            if conn.sock is not None and (self._timeout is None or self._timeout < 30):
                conn.sock.settimeout(30)
            try:
                conn.request("GET", f"/api/v1/jobs/{int(id)}/events", headers=headers)
                res = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise UnreachableError(f"the job service at {self.url}: {e}") from e
            if res.status != 200:
                try:
                    v = json.loads(res.read())
                except (ValueError, OSError, http.client.HTTPException):
                    v = {}
                e = v.get("error") if isinstance(v, dict) else None
                e = e if isinstance(e, dict) else {}
                raise APIError(
                    res.status, str(e.get("code", "unknown")), str(e.get("message", "(no message)"))
                )
            while True:
                try:
                    line = res.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise UnreachableError(f"the job service at {self.url}: {e}") from e
                if not line:
                    return
                try:
                    event = json.loads(line)
                except ValueError as e:
                    raise Error(f"the job service at {self.url} sent {line[:200]!r}") from e
                if event.get("type") == "job":
                    yield Job.from_dict(event["job"])
        finally:
            conn.close()

    def wait(
        self,
        id: int,
        poll: float = 1.0,
        timeout: Optional[float] = None,
        progress: Optional[Callable[[Job], None]] = None,
    ) -> Job:
        """Polls job ``id`` every ``poll`` seconds until it ends (done, failed or
        cancelled) and returns it; ``progress`` is called with each state seen, the last
        included. Raises :class:`WaitTimeout` after ``timeout`` seconds."""
        start = time.monotonic()
        while True:
            j = self.job(id)
            if progress is not None:
                progress(j)
            if j.ended:
                return j
            if timeout is not None and time.monotonic() - start >= timeout:
                raise WaitTimeout(j, timeout)
            time.sleep(poll)
