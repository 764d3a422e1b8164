#!/usr/bin/env python3
"""Submit a copy between two dmover servers to a job service and wait for its end,
printing progress.

    DMOVER_SERVICE=http://127.0.0.1:7780 DMOVER_TOKEN=... \\
        python3 submit_and_wait.py dmover://dtn1/data/run1 dmover://dtn2/incoming/

Options: --streams N, --verify, --fingerprint sha256:... (an https:// service's key;
else it is pinned on first use in the CLI's known-hosts file), --ca FILE.
"""

from __future__ import annotations

import argparse
import sys

from dmover_jobs import APIError, Client, Error, Job


def printable(s: str) -> str:
    """What a server said, or a name from its tree, safe for a terminal: control
    characters and bidi overrides escaped (as the CLI does)."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in s)


def show(job: Job) -> None:
    done = f"{job.fraction:6.1%}" if job.fraction is not None else "     ?"
    print(
        f"job {job.id}: {job.state:<9} {done}  {job.files_done}/{job.files_total} files  "
        f"{job.bytes}/{job.bytes_total} bytes  {job.rate / 1e6:.1f} MB/s",
        file=sys.stderr,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="sources, then the destination")
    p.add_argument("--service", help="the job service's URL (default: DMOVER_SERVICE)")
    p.add_argument("--token-file", help="your token on the service's server (default: DMOVER_TOKEN)")
    p.add_argument("--streams", type=int)
    p.add_argument("--verify", action="store_true")
    p.add_argument("--fingerprint", help="the https:// service's key, sha256:...")
    p.add_argument("--ca", help="a CA file that vouches for the https:// service")
    p.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    a = p.parse_args()
    if len(a.paths) < 2:
        p.error("give at least one source and a destination")
    try:
        c = Client(a.service, token_file=a.token_file, fingerprint=a.fingerprint, ca_file=a.ca)
        job = c.submit(a.paths[:-1], a.paths[-1], streams=a.streams, verify=a.verify)
        print(f"submitted job {job.id}", file=sys.stderr)
        job = c.wait(job.id, poll=1.0, timeout=a.timeout, progress=show)
    except APIError as e:
        print(f"error: {printable(e.message)} (HTTP {e.status}, {e.code})", file=sys.stderr)
        return 2 if e.status == 400 else 1
    except Error as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        return 1
    for f in job.file_errors:
        print(f"  {printable(f.path)}: {printable(f.error)}", file=sys.stderr)
    if job.error:
        print(f"error: {printable(job.error)}", file=sys.stderr)
    print(job.state)
    return 0 if job.state == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
