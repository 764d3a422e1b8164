"""A client of dmover's job service (``dmover serve --jobs``): submit copies between
dmover servers, wait for them with a progress callback, list, cancel and retry them.

Standard library only. The REST API it speaks is described in docs/openapi.json of the
dmover repository.

>>> from dmover_jobs import Client
>>> c = Client("http://127.0.0.1:7780", token_file="token")   # or DMOVER_SERVICE, DMOVER_TOKEN
>>> job = c.submit("dmover://dtn1/data/run1", "dmover://dtn2/incoming/")
>>> c.wait(job.id, progress=lambda j: print(j.state, j.bytes, j.bytes_total)).state
'done'
"""

from ._client import (
    APIError,
    Client,
    Error,
    TrustError,
    UnreachableError,
    WaitTimeout,
    default_known_hosts,
    spki_fingerprint,
)
from ._model import (
    END_STATES,
    ROUTES,
    STATES,
    FileError,
    Job,
    JobOptions,
    JobSpec,
    Page,
    SyncOptions,
)

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "Client",
    "END_STATES",
    "Error",
    "FileError",
    "Job",
    "JobOptions",
    "JobSpec",
    "Page",
    "ROUTES",
    "STATES",
    "SyncOptions",
    "TrustError",
    "UnreachableError",
    "WaitTimeout",
    "default_known_hosts",
    "spki_fingerprint",
]
