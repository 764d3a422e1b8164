"""The client against a real job service: ``dmover serve`` processes on loopback in a
temporary directory. A and S hold the data (S reads slowly, so a job there lasts
seconds), B receives it, C runs the job service with users alice, bob and root (an
admin). The binary is ``$DMOVER_BIN``, else ``target/release/dmover`` of the checkout.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import IO, Dict, List, Optional
from unittest import mock

import dmover_jobs
from dmover_jobs import APIError, Client, Job, TrustError, UnreachableError

HERE = Path(__file__).resolve().parent
BIN = os.environ.get("DMOVER_BIN") or str(HERE.parent.parent / "target" / "release" / "dmover")


def data(seed: int, n: int) -> bytes:
    """``n`` pseudo-random bytes."""
    out = bytearray()
    x = seed * 0x9E3779B97F4A7C15 % 2**64 | 1
    while len(out) < n:
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        out += x.to_bytes(8, "little")
    return bytes(out[:n])


class Proc:
    """A ``dmover serve`` process; its stdout's announcement lines read up to ``until``."""

    def __init__(self, args: List[str], log: Path, until: str) -> None:
        self.log = log
        with open(log, "wb") as err:
            self.p = subprocess.Popen(
                [BIN, "serve", *args], stdout=subprocess.PIPE, stderr=err, text=True
            )
        self.lines: dict[str, str] = {}
        out: IO[str] = self.p.stdout  # type: ignore[assignment]
        while until not in self.lines:
            line = out.readline()
            if not line:
                self.p.wait()
                raise RuntimeError(
                    f"dmover serve {' '.join(args)} exited {self.p.returncode}: {log.read_text()}"
                )
            key, _, value = line.strip().removeprefix("dmover: ").partition(" on ")
            if key.startswith("key fingerprint"):
                key, value = "fingerprint", key.split()[-1]
            self.lines[key] = value
        # Keep reading stdout so the server never blocks on it.
        threading.Thread(target=out.read, daemon=True).start()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if self.p.stdout is not None:
            self.p.stdout.close()


def credential(path: Path) -> str:
    """A new token in ``path``; its verifier for the config."""
    out = subprocess.run(
        [BIN, "credential", "token", str(path)], check=True, capture_output=True, text=True
    ).stdout
    return out.strip().split("=", 1)[1].strip()


class Hooks:
    """A webhook receiver on loopback: records each POST's headers and JSON body;
    answers 503 to the first, then 204."""

    def __init__(self) -> None:
        self.posts: List[tuple] = []
        hooks = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the library's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                hooks.posts.append(({k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
                self.send_response(503 if len(hooks.posts) == 1 else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/"

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ServiceTest(unittest.TestCase):
    hooks: Hooks
    tmp: Path
    procs: List[Proc]
    url: str
    a: str
    s: str
    b: str
    tokens: Dict[str, str]
    files: Dict[str, bytes]
    config: Path

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = Path(tempfile.mkdtemp(prefix="dmover-py-"))
        cls.procs = []
        try:
            cls._start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _start(cls) -> None:
        t = cls.tmp
        for d in ("a/run/sub", "s/big", "b/in", "c", "state"):
            (t / d).mkdir(parents=True)
        cls.files = {
            "run/one": data(1, 300_000),
            "run/sub/two": data(2, 5_000),
            "run/empty": b"",
        }
        for name, content in cls.files.items():
            (t / "a" / name).write_bytes(content)
        # 24 files of 256 KiB read at 100 ms a chunk: seconds.
        for i in range(24):
            (t / "s" / "big" / str(i)).write_bytes(data(100 + i, 256 << 10))

        def server(name: str, *extra: str) -> Proc:
            p = Proc(
                ["--root", str(t / name), "--listen", "127.0.0.1:0", "--third-party",
                 "--state-dir", str(t / f"state/{name}"), *extra],
                t / f"{name}.log",
                "listening",
            )
            cls.procs.append(p)
            return p

        cls.a = server("a").lines["listening"]
        cls.s = server("s", "--io-threads", "1", "--debug-chunk-delay-ms", "100").lines["listening"]
        cls.b = server("b").lines["listening"]
        cls.tokens = {}
        users = ""
        for u in ("alice", "bob", "root"):
            verifier = credential(t / f"{u}.token")
            cls.tokens[u] = (t / f"{u}.token").read_text().strip()
            users += f'[users.{u}]\ntoken = {verifier}\nexports = {{ c = "ro" }}\n\n'
        cls.hooks = Hooks()
        cls.hooks.start()
        config = t / "c.toml"
        config.write_text(
            f'[exports.c]\npath = "{t / "c"}"\n\n{users}'
            '[jobs]\nenabled = true\nadmins = ["root"]\nretry_wait = "1s"\n'
            f'webhooks = ["{cls.hooks.url}"]\n'
        )
        cls.config = config
        c = Proc(
            ["--config", str(config), "--listen", "127.0.0.1:0", "--jobs-listen", "127.0.0.1:0",
             "--state-dir", str(t / "state/c")],
            t / "c.log",
            "jobs",
        )
        cls.procs.append(c)
        cls.url = c.lines["jobs"]

    @classmethod
    def tearDownClass(cls) -> None:
        for p in cls.procs:
            p.stop()
        if getattr(cls, "hooks", None) is not None:
            cls.hooks.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def client(self, user: str = "alice", **kw: object) -> Client:
        return Client(self.url, token=self.tokens[user], **kw)  # type: ignore[arg-type]

    def src(self, path: str, server: Optional[str] = None) -> str:
        return f"dmover://{server or self.a}/{path}"

    def dst(self, path: str) -> str:
        return f"dmover://{self.b}/{path}"

    def test_submit_and_wait_with_progress(self) -> None:
        c = self.client()
        (self.tmp / "b/in/copy").mkdir()
        job = c.submit(self.src("run"), self.dst("in/copy/"), streams=2, verify=True)
        self.assertIsInstance(job, Job)
        self.assertEqual((job.state, job.owner, job.kind), ("queued", "alice", "copy"))
        self.assertEqual(job.spec.options.streams, 2)
        seen: List[Job] = []
        done = c.wait(job.id, poll=0.05, timeout=60, progress=seen.append)
        self.assertEqual(done.state, "done", done)
        self.assertTrue(done.ended)
        self.assertEqual((done.files_done, done.files_total), (3, 3))
        self.assertEqual(done.bytes, sum(len(v) for v in self.files.values()))
        self.assertEqual(done.fraction, 1.0)
        self.assertIsNotNone(done.ended_ms)
        self.assertTrue(seen, "the progress callback was called")
        self.assertEqual(seen[-1], done)
        for name, content in self.files.items():
            self.assertEqual((self.tmp / "b/in/copy" / name).read_bytes(), content, name)

    def test_a_sync_job_with_a_filter_and_a_priority(self) -> None:
        c = self.client()
        mirror = self.tmp / "b/in/mirror"
        mirror.mkdir()
        (mirror / "stale").write_bytes(b"not in the source")
        job = c.submit(
            self.src("run"),
            self.dst("in/mirror"),
            sync=dmover_jobs.SyncOptions(delete=True),
            exclude=["two"],
            priority=5,
        )
        self.assertEqual((job.kind, job.priority), ("sync", 5), job)
        self.assertEqual(job.spec.options.filters, ((False, "two"),))
        self.assertIn(" -> ", job.link)
        done = c.wait(job.id, poll=0.05, timeout=60)
        self.assertEqual(done.state, "done", done)
        self.assertEqual((mirror / "one").read_bytes(), self.files["run/one"])
        self.assertFalse((mirror / "stale").exists(), "deleted: the source does not hold it")
        self.assertFalse((mirror / "sub/two").exists(), "excluded")

    def test_a_webhook_gets_the_ended_job(self) -> None:
        c = self.client()
        with self.assertRaises(APIError) as refused:
            c.submit(self.src("run"), self.dst("in/"), notify="http://127.0.0.1:9/elsewhere")
        self.assertEqual(refused.exception.status, 400)
        self.assertIn("allow-list", str(refused.exception))
        (self.tmp / "b/in/hooked").mkdir()
        job = c.submit(self.src("run"), self.dst("in/hooked/"), notify=self.hooks.url + "x")
        self.assertEqual(job.spec.options.notify, self.hooks.url + "x")
        deadline = time.monotonic() + 60
        while (j := c.job(job.id)).webhook != "delivered":
            self.assertLess(time.monotonic(), deadline, j)
            time.sleep(0.05)
        self.assertEqual(j.state, "done", j)
        mine = [p for p in self.hooks.posts if p[1]["id"] == job.id]
        self.assertEqual(len(mine), 2, "a 503, then taken")
        headers, body = mine[-1]
        self.assertEqual(headers.get("x-dmover-job"), str(job.id))
        self.assertEqual(Job.from_dict(body).state, "done")
        self.assertEqual(body["bytes"], sum(len(v) for v in self.files.values()))

    def test_a_recurring_sync_waits_queued_between_runs(self) -> None:
        c = self.client()
        sync = dmover_jobs.SyncOptions()
        with self.assertRaises(APIError) as refused:
            c.submit(self.src("run"), self.dst("in/every"), sync=sync, every_secs=30)
        self.assertIn("too often", str(refused.exception))
        job = c.submit(self.src("run"), self.dst("in/every"), sync=sync, every_secs=3600)
        self.assertEqual(job.spec.options.every_secs, 3600)
        deadline = time.monotonic() + 60
        while not ((j := c.job(job.id)).attempts == 1 and j.state == "queued"):
            self.assertLess(time.monotonic(), deadline, j)
            time.sleep(0.05)
        self.assertIsNotNone(j.started_ms)
        self.assertEqual(j.not_before_ms, j.started_ms + 3_600_000)
        self.assertEqual((self.tmp / "b/in/every/one").read_bytes(), self.files["run/one"])
        self.assertEqual(c.cancel(job.id).state, "cancelled")

    def test_list_and_pages(self) -> None:
        c = self.client("bob")
        ids = [c.submit(self.src(f"nothing/{i}"), self.dst("in/")).id for i in range(5)]
        page = c.jobs(limit=2)
        self.assertEqual([j.id for j in page.jobs], [ids[4], ids[3]])
        self.assertEqual(page.next, ids[3])
        walked = [j.id for j in c.iter_jobs(page_size=2)]
        self.assertEqual(walked, ids[::-1], "every page, newest first")
        self.assertTrue(all(j.owner == "bob" for j in c.iter_jobs()))
        # An admin sees everyone's jobs too.
        admin = [j.id for j in self.client("root").iter_jobs(page_size=3)]
        self.assertTrue(set(ids) <= set(admin))
        for i in ids:
            j = c.wait(i, poll=0.05, timeout=60)
            self.assertEqual(j.state, "failed", j)
            self.assertIn("no such file", j.error or "", j)
            self.assertEqual(len(j.file_errors), 1, j)

    def test_cancel_then_retry(self) -> None:
        c = self.client()
        (self.tmp / "b/in/slow").mkdir()
        job = c.submit(self.src("big", self.s), self.dst("in/slow/"))
        t = time.monotonic()
        while c.job(job.id).state != "running":
            self.assertLess(time.monotonic() - t, 60, "the job starts")
            time.sleep(0.02)
        cancelled = c.cancel(job.id)
        self.assertTrue(cancelled.cancel_requested or cancelled.state == "cancelled", cancelled)
        j = c.wait(job.id, poll=0.05, timeout=60)
        self.assertEqual(j.state, "cancelled", j)
        big = self.tmp / "b/in/slow/big"
        whole = [f for f in big.iterdir() if not f.name.startswith(".dmv.")] if big.exists() else []
        self.assertLess(len(whole), 24, "cancelled mid-way")
        for f in whole:
            self.assertEqual(f.read_bytes(), data(100 + int(f.name), 256 << 10), f)
        r = c.retry(job.id)
        self.assertEqual(r.state, "queued")
        # Followed through its event stream this time: it runs, bytes grow, it ends.
        followed = list(c.events(job.id))
        j = followed[-1]
        self.assertEqual((j.state, j.attempts), ("done", 2), j)
        self.assertIn("running", [f.state for f in followed], followed)
        self.assertTrue(all(f.state != "done" for f in followed[:-1]), followed)
        grown = [f.bytes for f in followed]
        self.assertEqual(grown, sorted(grown), grown)
        # An ended job's stream: one line, the job.
        self.assertEqual(list(c.events(job.id)), [c.job(job.id)])
        with self.assertRaises(APIError) as e:
            next(self.client("bob").events(job.id))
        self.assertEqual(e.exception.status, 404)
        for i in range(24):
            self.assertEqual((big / str(i)).read_bytes(), data(100 + i, 256 << 10), i)
        # An ended job is neither cancelled nor retried again.
        for act in (c.cancel, c.retry):
            with self.assertRaises(APIError) as e:
                act(job.id)
            self.assertEqual((e.exception.status, e.exception.code), (409, "conflict"))

    def test_errors(self) -> None:
        bad = Client(self.url, token="not-a-token")
        with self.assertRaises(APIError) as e:
            bad.submit(self.src("run"), self.dst("in/"))
        self.assertEqual((e.exception.status, e.exception.code), (401, "unauthorized"))
        self.assertIn("HTTP 401", str(e.exception))
        with self.assertRaises(APIError) as e:
            Client(self.url, token=None).jobs()
        self.assertEqual(e.exception.status, 401)
        c = self.client()
        with self.assertRaises(APIError) as e:
            c.submit("/etc/hostname", self.dst("in/"))
        self.assertEqual((e.exception.status, e.exception.code), (400, "bad_request"))
        self.assertIn("local path", e.exception.message)
        with self.assertRaises(APIError) as e:
            c.submit(self.src("run"), self.dst("in/"), streams=500)
        self.assertEqual(e.exception.status, 400)
        with self.assertRaises(APIError) as e:
            c.job(999_999)
        self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))
        # Another user's job is as missing as no job.
        mine = c.submit(self.src("nothing"), self.dst("in/"))
        with self.assertRaises(APIError) as e:
            self.client("bob").cancel(mine.id)
        self.assertEqual(e.exception.status, 404)
        self.assertEqual(self.client("root").job(mine.id).owner, "alice")
        (self.tmp / "b/in/w").mkdir()
        with self.assertRaises(dmover_jobs.WaitTimeout) as w:
            # A wait that cannot see the end in time: a job of seconds, and a zero
            # timeout, which gives up after the first look.
            c.wait(c.submit(self.src("big", self.s), self.dst("in/w/")).id, timeout=0)
        self.assertIn(w.exception.job.state, ("queued", "running"))
        c.cancel(w.exception.job.id)
        # Nothing listens there.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with self.assertRaises(UnreachableError):
            Client(f"http://127.0.0.1:{port}", token="x", timeout=5).jobs()
        for url in ("ftp://x:1", "http://h:1/api", "nothing"):
            with self.assertRaises(ValueError):
                Client(url, token="x")

    def test_the_example_runs(self) -> None:
        example = HERE.parent / "examples" / "submit_and_wait.py"
        (self.tmp / "b/in/example").mkdir()
        env = dict(os.environ, DMOVER_SERVICE=self.url, DMOVER_TOKEN=self.tokens["alice"])
        r = subprocess.run(
            [sys.executable, str(example), self.src("run/one"), self.dst("in/example/")],
            env=env, capture_output=True, text=True, timeout=120,
        )
        self.assertEqual((r.returncode, r.stdout), (0, "done\n"), r.stderr)
        self.assertIn("submitted job", r.stderr)
        self.assertEqual((self.tmp / "b/in/example/one").read_bytes(), self.files["run/one"])
        r = subprocess.run(
            [sys.executable, str(example), "/etc/hostname", self.dst("in/")],
            env=env, capture_output=True, text=True, timeout=120,
        )
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("local path", r.stderr)

    def test_environment_and_token_file(self) -> None:
        env = {"DMOVER_SERVICE": self.url, "DMOVER_TOKEN": self.tokens["bob"] + "\n"}
        with mock.patch.dict(os.environ, env):
            self.assertTrue(all(j.owner == "bob" for j in Client().jobs(limit=5).jobs))
        with mock.patch.dict(os.environ, {}, clear=True):
            with self.assertRaises(ValueError):
                Client()
        c = Client(self.url, token_file=self.tmp / "bob.token")
        self.assertTrue(all(j.owner == "bob" for j in c.jobs().jobs))


def tls_service(d: Path) -> Proc:
    """A job service in ``d`` whose API serves TLS on loopback: it listens on
    ``[::ffff:127.0.0.1]``, IPv4's loopback as an IPv6 (v4-mapped) address, which the
    service does not take for loopback (a test must stay on loopback)."""
    (d / "c").mkdir(parents=True)
    credential(d / "token")
    try:
        return Proc(
            ["--root", str(d / "c"), "--token-file", str(d / "token"),
             "--listen", "127.0.0.1:0", "--jobs", "--jobs-listen", "[::ffff:127.0.0.1]:0",
             "--state-dir", str(d / "state")],
            d / "c.log",
            "jobs",
        )
    except RuntimeError as e:
        if "Address family not supported" in str(e) or "Cannot assign" in str(e):
            raise unittest.SkipTest(f"no IPv6 on this host: {e}")
        raise


class TlsServiceTest(unittest.TestCase):
    """An https:// service: its key pinned by fingerprint or in a known-hosts file, or
    its certificate checked against a CA file."""

    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="dmover-py-tls-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.proc = tls_service(self.tmp / "one")
        self.addCleanup(self.proc.stop)
        self.token = (self.tmp / "one/token").read_text().strip()
        self.url = self.proc.lines["jobs"]
        self.fp = self.proc.lines["fingerprint"]

    def test_the_key_is_pinned(self) -> None:
        self.assertTrue(self.url.startswith("https://"), self.url)
        self.assertTrue(self.fp.startswith("sha256:"), self.fp)
        # By fingerprint.
        page = Client(self.url, token=self.token, fingerprint=self.fp).jobs()
        self.assertEqual(page.jobs, [])
        wrong = "sha256:" + "A" * 43
        with self.assertRaises(TrustError):
            Client(self.url, token=self.token, fingerprint=wrong).jobs()
        # On first use in a known-hosts file, the CLI's format.
        kh = self.tmp / "kh" / "known_hosts"
        Client(self.url, token=self.token, known_hosts=kh).jobs()
        host = self.url.removeprefix("https://")
        self.assertEqual(kh.read_text(), f"{host} {self.fp}\n")
        Client(self.url, token=self.token, known_hosts=kh).jobs()
        self.assertEqual(kh.read_text(), f"{host} {self.fp}\n", "pinned once")
        kh.write_text(f"# a changed key\n{host} {wrong}\n")
        with self.assertRaises(TrustError) as e:
            Client(self.url, token=self.token, known_hosts=kh).jobs()
        self.assertIn("line 2", str(e.exception))
        # The default file is the CLI's, under XDG_CONFIG_HOME.
        with mock.patch.dict(os.environ, {"XDG_CONFIG_HOME": str(self.tmp / "xdg")}):
            Client(self.url, token=self.token).jobs()
        self.assertIn(self.fp, (self.tmp / "xdg/dmover/known_hosts").read_text())
        # A CA file holding another service's certificate does not vouch for this one.
        other = tls_service(self.tmp / "two")
        self.addCleanup(other.stop)
        host, _, port = other.lines["jobs"].removeprefix("https://[").partition("]:")
        ca = self.tmp / "other.pem"
        ca.write_text(ssl.get_server_certificate((host, int(port))))
        with self.assertRaises(TrustError):
            Client(self.url, token=self.token, ca_file=ca).jobs()


if __name__ == "__main__":
    unittest.main()
