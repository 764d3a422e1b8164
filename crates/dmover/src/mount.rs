//! `dmover mount`: a server's tree as a read-only FUSE file system (issue 14), on top
//! of [`dmover_core::remote::Remote`] (docs/remote.md).
//!
//! The tree is a *snapshot*: one request-driven pull session of the export path whose
//! manifest gives every name, attribute and listing. A snapshot older than
//! `--attr-timeout` is replaced by a fresh session at the next lookup, getattr or
//! readdir that needs one, so a change on the server shows after that time. An open
//! file reads through the session it was opened in, and moves to a newer one when the
//! file is unchanged there (what happens to a file changed while open: docs/remote.md).
//! Inode numbers stay with paths for the whole mount.
//!
//! Every FUSE request that needs the network is answered from a task on the tokio
//! runtime, never on the FUSE thread, and within `--timeout`: a dead or silent server
//! gives EIO, never a hung process.
//!
//! With `--rw` a file is written whole: a file created, or an existing one opened for
//! writing (empty with `O_TRUNC`, else fetched first, up to [`REWRITE_CAP`]), lives in a
//! local staging file and is pushed at close (staging + rename on the server, so a
//! partial file never shows under its name). unlink, rmdir and rename change the
//! server at once ([`Client::remove_entry`], [`Client::rename_remote`]) and drop the
//! snapshot, so the next lookup sees the change.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use dmover_core::client::Client;
use dmover_core::remote::{Remote, RemoteOptions, StagedFile};
use dmover_proto::manifest::{Entry, EntryKind};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};

use crate::resolve::MountJob;

/// The largest existing file `--rw` rewrites when it is opened for writing without
/// `O_TRUNC` (or truncated to a length other than 0): it is fetched whole into the
/// staging file first. Larger ones: EFBIG (docs/remote.md).
pub(crate) const REWRITE_CAP: u64 = 256 << 20;

/// `dmover mount`, resolved.
pub fn run(a: MountJob) -> anyhow::Result<ExitCode> {
    let (server, path) = (a.server.clone(), a.path.clone());
    let rt = a.client.runtime()?;
    let client = a.client.client();
    let inner = Arc::new(Inner {
        client,
        server: server.clone(),
        path: path.clone(),
        ropts: RemoteOptions {
            cache_bytes: a.cache,
            read_ahead: a.read_ahead,
        },
        ttl: a.attr_timeout,
        timeout: a.timeout,
        tree: tokio::sync::Mutex::new(Tree::default()),
        last: Mutex::new(None),
        inodes: Mutex::new(Inodes::new()),
        handles: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(1),
        rw: a
            .rw
            .then(|| {
                tempfile::Builder::new()
                    .prefix("dmover-mount-")
                    .tempdir()
                    .context("a directory for the files being written")
            })
            .transpose()?,
        writers: Mutex::new(HashMap::new()),
        writer_fhs: Mutex::new(HashMap::new()),
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
    });
    // The first snapshot before mounting: a refused path, a bad credential or a server
    // that is not there fail here, with nothing mounted.
    let snap = rt.block_on(inner.snapshot_now())?;
    if !matches!(snap.entry(snap.root).kind, EntryKind::Dir) {
        bail!(
            "{}: not a directory on the server (a mount needs a directory)",
            String::from_utf8_lossy(&path)
        );
    }
    rt.block_on(inner.tree.lock()).snap = Some(snap);
    let fs = Fs {
        inner: inner.clone(),
        rt: rt.handle().clone(),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!(
            "dmover://{server}/{}",
            String::from_utf8_lossy(&path)
        )),
        MountOption::Subtype("dmover".into()),
        if a.rw {
            MountOption::RW
        } else {
            MountOption::RO
        },
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::DefaultPermissions,
    ];
    let dir = a.dir.canonicalize().context("the mount point")?;
    let mut session = fuser::Session::new(fs, &dir, &config).map_err(|e| {
        anyhow::anyhow!(
            "mounting on {}: {e} (FUSE needs /dev/fuse; as a user who is not root, \
             also fusermount3 from the fuse3 package)",
            dir.display()
        )
    })?;
    let unmounter = session.unmount_callable();
    unmount_on_signal(&rt, unmounter, dir.clone(), inner.clone());
    println!(
        "dmover: mounted dmover://{server}/{} on {} ({})",
        String::from_utf8_lossy(&path),
        dir.display(),
        if a.rw { "read-write" } else { "read-only" }
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let r = session.run();
    tracing::info!("unmounted {}", dir.display());
    drop(rt);
    r.with_context(|| format!("serving the mount on {}", dir.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// On SIGINT or SIGTERM: unmount (lazily if files are still open, so nothing stays in
/// the mount table), which ends the session's loop; if it has not ended 3 s later
/// (files still open keep a detached mount alive), exit: closing /dev/fuse ends the
/// connection.
fn unmount_on_signal(
    rt: &tokio::runtime::Runtime,
    mut unmounter: fuser::SessionUnmounter,
    dir: std::path::PathBuf,
    inner: Arc<Inner>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = rt.block_on(async {
        (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        )
    }) else {
        tracing::warn!("cannot catch SIGINT/SIGTERM: unmount with `umount`");
        return;
    };
    rt.spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        tracing::info!("signal: unmounting {}", dir.display());
        // Files still open for writing are not uploaded half-written: say which.
        let open: Vec<String> = inner
            .writers
            .lock()
            .unwrap()
            .keys()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        for p in &open {
            eprintln!(
                "dmover: {p}: still open for writing at the unmount (uploaded only if \
                 closed within 3 s)"
            );
        }
        // The unmount is a system call that may wait for the kernel: off the runtime.
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = unmounter.unmount() {
                tracing::info!("unmount: {e}; detaching instead");
                if let Err(e) = rustix::mount::unmount(&dir, rustix::mount::UnmountFlags::DETACH) {
                    eprintln!("dmover: error: unmounting {}: {e}", dir.display());
                }
            }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        eprintln!("dmover: files were still open; exiting (the mount is detached)");
        // `exit` runs no destructors: the staging directory goes here.
        if let Some(d) = &inner.rw {
            let _ = std::fs::remove_dir_all(d.path());
        }
        std::process::exit(if open.is_empty() { 0 } else { 1 });
    });
}

/// One session's view of the tree.
struct Snapshot {
    remote: Remote,
    taken: Instant,
    /// The export's root entry.
    root: u32,
    /// Path below the root (`a/b`, empty for the root) → entry.
    by_path: HashMap<Vec<u8>, u32>,
    /// Entry → path below the root.
    paths: Vec<Vec<u8>>,
}

impl Snapshot {
    fn new(remote: Remote) -> anyhow::Result<Snapshot> {
        let root = *remote
            .roots()
            .first()
            .context("the server sent an empty manifest")?;
        let entries = remote.entries();
        let mut paths: Vec<Vec<u8>> = vec![Vec::new(); entries.len()];
        let mut by_path = HashMap::with_capacity(entries.len());
        by_path.insert(Vec::new(), root);
        // Parents come before their children in a manifest.
        for (i, e) in entries.iter().enumerate() {
            if i as u32 == root {
                continue;
            }
            let Some(parent) = paths.get(e.parent as usize) else {
                continue;
            };
            let mut p = parent.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(&e.name);
            by_path.insert(p.clone(), i as u32);
            paths[i] = p;
        }
        Ok(Snapshot {
            remote,
            taken: Instant::now(),
            root,
            by_path,
            paths,
        })
    }

    fn entry(&self, i: u32) -> &Entry {
        &self.remote.entries()[i as usize]
    }
}

/// The current snapshot, and when the last attempt to take one failed.
#[derive(Default)]
struct Tree {
    snap: Option<Arc<Snapshot>>,
    failed: Option<Instant>,
}

/// Inode numbers, one per path for the whole mount (1 is the root).
struct Inodes {
    by_path: HashMap<Vec<u8>, u64>,
    paths: Vec<Vec<u8>>,
}

impl Inodes {
    fn new() -> Self {
        Inodes {
            by_path: HashMap::from([(Vec::new(), 1)]),
            paths: vec![Vec::new()],
        }
    }

    fn ino(&mut self, path: &[u8]) -> u64 {
        if let Some(&i) = self.by_path.get(path) {
            return i;
        }
        self.paths.push(path.to_vec());
        let i = self.paths.len() as u64;
        self.by_path.insert(path.to_vec(), i);
        i
    }

    fn path(&self, ino: u64) -> Option<Vec<u8>> {
        self.paths.get((ino as usize).checked_sub(1)?).cloned()
    }

    /// After a rename: the inode numbers of `from` and of what is below it go with
    /// them to `to` (the kernel keeps its inodes across a rename).
    fn rename(&mut self, from: &[u8], to: &[u8]) {
        for (i, p) in self.paths.iter_mut().enumerate() {
            let below = p.len() > from.len() && p.starts_with(from) && p[from.len()] == b'/';
            if p.as_slice() != from && !below {
                continue;
            }
            let mut moved = to.to_vec();
            moved.extend_from_slice(&p[from.len()..]);
            self.by_path.remove(p.as_slice());
            self.by_path.insert(moved.clone(), i as u64 + 1);
            *p = moved;
        }
    }
}

/// A file created through the mount (`--rw`): written into a local staging file,
/// uploaded whole (an ordinary push: staging and rename on the server) at each flush
/// that follows a change, so the server's copy appears complete or not at all.
struct Writer {
    path: Vec<u8>,
    ino: INodeNo,
    /// The library's staged file (its staging file goes when the writer does).
    file: StagedFile,
    /// Changed since the last upload (or never uploaded).
    dirty: std::sync::atomic::AtomicBool,
    /// One upload at a time.
    upload: tokio::sync::Mutex<()>,
    /// Open handles on it.
    opens: AtomicU64,
}

/// An open file or directory: the snapshot it was opened in and its entry there.
struct Handle {
    snap: Arc<Snapshot>,
    entry: u32,
}

struct Inner {
    client: Client,
    server: String,
    path: Vec<u8>,
    ropts: RemoteOptions,
    ttl: Duration,
    timeout: Duration,
    tree: tokio::sync::Mutex<Tree>,
    /// The last snapshot taken, for what needs no fresh one (statfs).
    last: Mutex<Option<Arc<Snapshot>>>,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    /// With `--rw`: where new files are written before they are uploaded.
    rw: Option<tempfile::TempDir>,
    /// Files created through the mount and not yet released: path → the file.
    writers: Mutex<HashMap<Vec<u8>, Arc<Writer>>>,
    /// Open handles on those files.
    writer_fhs: Mutex<HashMap<u64, Arc<Writer>>>,
    uid: u32,
    gid: u32,
}

impl Inner {
    /// A new session of the export, within the timeout.
    async fn snapshot_now(&self) -> anyhow::Result<Arc<Snapshot>> {
        let open = Remote::open_with(&self.client, &self.server, &self.path, self.ropts);
        let remote = match tokio::time::timeout(self.timeout, open).await {
            Ok(r) => r.with_context(|| {
                format!(
                    "opening dmover://{}/{}",
                    self.server,
                    String::from_utf8_lossy(&self.path)
                )
            })?,
            Err(_) => bail!(
                "dmover://{}: no answer within {:?}",
                self.server,
                self.timeout
            ),
        };
        let s = Arc::new(Snapshot::new(remote)?);
        *self.last.lock().unwrap() = Some(s.clone());
        Ok(s)
    }

    /// The current snapshot, or a fresh one if it is older than the attribute
    /// timeout. One refresh at a time; a failed one is not tried again for the
    /// attribute timeout (the requests in between fail at once).
    async fn snapshot(&self) -> Result<Arc<Snapshot>, Errno> {
        let asked = Instant::now();
        let mut tree = self.tree.lock().await;
        if let Some(s) = &tree.snap
            && (s.taken.elapsed() < self.ttl || s.taken >= asked)
        {
            return Ok(s.clone());
        }
        if let Some(t) = tree.failed
            && (t.elapsed() < self.ttl || t >= asked)
        {
            return Err(Errno::EIO);
        }
        match self.snapshot_now().await {
            Ok(s) => {
                tree.snap = Some(s.clone());
                tree.failed = None;
                Ok(s)
            }
            Err(e) => {
                tracing::warn!("{e:#}");
                tree.snap = None;
                tree.failed = Some(Instant::now());
                Err(Errno::EIO)
            }
        }
    }

    fn writer_fhs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Writer>>> {
        self.writer_fhs.lock().unwrap()
    }

    fn writer_fh(&self, fh: FileHandle) -> Option<Arc<Writer>> {
        self.writer_fhs().get(&fh.0).cloned()
    }

    /// What a change the mount cannot make fails with: EROFS read-only, else
    /// EOPNOTSUPP (docs/remote.md).
    fn unsupported(&self) -> Errno {
        if self.rw.is_some() {
            Errno::EOPNOTSUPP
        } else {
            Errno::EROFS
        }
    }

    fn writer_at(&self, path: &[u8]) -> Option<Arc<Writer>> {
        self.writers.lock().unwrap().get(path).cloned()
    }

    fn writer_of(&self, ino: INodeNo) -> Option<Arc<Writer>> {
        let path = self.path_of(ino).ok()?;
        self.writer_at(&path)
    }

    /// The attributes of a file being written: its staging file's.
    fn writer_attr(&self, w: &Writer) -> Result<FileAttr, Errno> {
        use std::os::unix::fs::MetadataExt;
        let m = w.file.file().metadata().map_err(Errno::from)?;
        let mtime = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(FileAttr {
            ino: w.ino,
            size: m.len(),
            blocks: m.len().div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind: FileType::RegularFile,
            perm: (m.mode() & 0o7777) as u16,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 128 << 10,
            flags: 0,
        })
    }

    /// The server's path of `path` below the mount's root.
    fn remote_path(&self, path: &[u8]) -> Vec<u8> {
        let mut p = self.path.clone();
        while p.last() == Some(&b'/') {
            p.pop();
        }
        if !path.is_empty() {
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(path);
        }
        p
    }

    /// Pushes local `src` (a file or an empty directory) to `path` below the root, as
    /// `dmover cp` does (staging and rename on the server), within the timeout; the
    /// next lookup takes a fresh snapshot.
    async fn upload(&self, src: &std::path::Path, path: &[u8]) -> Result<(), Errno> {
        let sources = [src.as_os_str().as_bytes().to_vec()];
        let dest = self.remote_path(path);
        let run = dmover_core::engine::Run::new();
        let push = self.client.push(&sources, &self.server, &dest, run.clone());
        let r = match tokio::time::timeout(self.timeout, push).await {
            Ok(r) => r.map(|_| ()).map_err(|e| e.to_string()),
            Err(_) => {
                run.fail(dmover_core::Error::Aborted);
                Err(format!("no answer within {:?}", self.timeout))
            }
        };
        self.uploaded(path, r).await
    }

    /// After an upload to `path`: the next lookup takes a fresh snapshot; a failure is
    /// logged and answered with EIO.
    async fn uploaded(&self, path: &[u8], r: Result<(), String>) -> Result<(), Errno> {
        self.tree.lock().await.snap = None;
        r.map_err(|e| {
            tracing::warn!(
                "uploading {} to the server: {e}",
                String::from_utf8_lossy(path)
            );
            Errno::EIO
        })
    }

    /// A new file being written at `path`: an empty local staging file with `mode`,
    /// registered (with `opens` handles) so lookups and opens find it. `dirty`: upload
    /// it at the next flush even if nothing is written (a create, a truncation).
    fn new_writer(
        &self,
        path: &[u8],
        mode: u32,
        dirty: bool,
        opens: u64,
    ) -> Result<Arc<Writer>, Errno> {
        let dir = self.rw.as_ref().ok_or(Errno::EROFS)?.path();
        let file = StagedFile::create(dir, &self.server, &self.remote_path(path), mode)
            .map_err(|e| errno_of(&e))?;
        let w = Arc::new(Writer {
            ino: self.ino(path),
            path: path.to_vec(),
            file,
            dirty: std::sync::atomic::AtomicBool::new(dirty),
            upload: tokio::sync::Mutex::new(()),
            opens: AtomicU64::new(opens),
        });
        self.writers
            .lock()
            .unwrap()
            .insert(path.to_vec(), w.clone());
        Ok(w)
    }

    /// Waits (briefly) until no file is being written at `path`: a file closed and
    /// uploaded is released right after its `close()` returns, so a `close` followed by
    /// a rename or unlink of the name finds it on the server. A file with changes not
    /// uploaded, or still open after 1 s: EBUSY (it is not on the server as it is).
    async fn settled(&self, path: &[u8]) -> Result<(), Errno> {
        let end = Instant::now() + Duration::from_secs(1);
        while let Some(w) = self.writer_at(path) {
            if w.dirty.load(Relaxed) || Instant::now() > end {
                return Err(Errno::EBUSY);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Forgets a writer no handle uses any more (its staging file goes with the last
    /// reference).
    fn drop_writer(&self, w: &Writer) {
        self.writers.lock().unwrap().remove(&w.path);
    }

    /// An existing remote file, to be rewritten whole at `path`: a writer holding
    /// `keep` bytes of it (0: none, as `O_TRUNC`), fetched through `snap`, with its mode
    /// and (when nothing was cut) its mtime, so an unchanged file is not uploaded again.
    /// Files larger than [`REWRITE_CAP`] that would need fetching: EFBIG.
    async fn rewrite(
        &self,
        snap: &Snapshot,
        entry: u32,
        path: &[u8],
        keep: Option<u64>,
        opens: u64,
    ) -> Result<Arc<Writer>, Errno> {
        let e = snap.entry(entry);
        let size = match e.kind {
            EntryKind::File { size } => size,
            EntryKind::Dir => return Err(Errno::EISDIR),
            EntryKind::Symlink { .. } => return Err(Errno::ELOOP),
            // A mount's session does not use hard links (no `LINKS`): never listed.
            EntryKind::HardLink { .. } => return Err(Errno::EOPNOTSUPP),
        };
        let keep = keep.unwrap_or(size);
        let fetch = keep.min(size);
        if fetch > REWRITE_CAP {
            return Err(Errno::EFBIG);
        }
        let w = self.new_writer(path, e.mode, keep != size, opens)?;
        let r = async {
            if let Err(err) = w.file.fetch(&snap.remote, entry, fetch, self.timeout).await {
                tracing::warn!(
                    "fetching {} to rewrite it: {err}",
                    String::from_utf8_lossy(path)
                );
                return Err(Errno::EIO);
            }
            let f = w.file.file();
            f.set_len(keep).map_err(Errno::from)?;
            if keep == size {
                f.set_modified(system_time(e.mtime)).map_err(Errno::from)?;
            }
            Ok(())
        }
        .await;
        if let Err(err) = r {
            self.drop_writer(&w);
            return Err(err);
        }
        Ok(w)
    }

    /// Uploads `w` if it changed since its last upload.
    async fn flush_writer(&self, w: &Writer) -> Result<(), Errno> {
        let _one = w.upload.lock().await;
        if !w.dirty.swap(false, Relaxed) {
            return Ok(());
        }
        // In one of the client's upload slots: a thousand files closed at once upload
        // a few at a time; the wait for a slot is not timed, the upload is.
        let run = dmover_core::engine::Run::new();
        let r = w.file.upload_within(&self.client, run, self.timeout).await;
        let r = self.uploaded(&w.path, r.map_err(|e| e.to_string())).await;
        if r.is_err() {
            w.dirty.store(true, Relaxed);
        }
        r
    }

    /// Runs a change on the server within the timeout; whatever the outcome, the
    /// snapshot is dropped, so the next lookup sees the server's tree as it is now.
    async fn changed(
        &self,
        change: impl std::future::Future<Output = dmover_core::Result<()>>,
    ) -> Result<(), Errno> {
        let r = tokio::time::timeout(self.timeout, change).await;
        self.tree.lock().await.snap = None;
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!("{e}");
                Err(errno_of(&e))
            }
            Err(_) => {
                tracing::warn!("a change got no answer within {:?}", self.timeout);
                Err(Errno::EIO)
            }
        }
    }

    fn ino(&self, path: &[u8]) -> INodeNo {
        INodeNo(self.inodes.lock().unwrap().ino(path))
    }

    fn path_of(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        self.inodes.lock().unwrap().path(ino.0).ok_or(Errno::ENOENT)
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handles
            .lock()
            .unwrap()
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    /// Open file `fh`, moved to the newest snapshot if its file is unchanged there
    /// (same kind, size and mtime): sessions that only old handles used then close.
    fn file(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        let h = self.handle(fh)?;
        let Some(last) = self.last.lock().unwrap().clone() else {
            return Ok(h);
        };
        if Arc::ptr_eq(&last, &h.snap) {
            return Ok(h);
        }
        let path = &h.snap.paths[h.entry as usize];
        let Some(&entry) = last.by_path.get(path) else {
            return Ok(h);
        };
        let (a, b) = (last.entry(entry), h.snap.entry(h.entry));
        if (&a.kind, a.mode, a.mtime) != (&b.kind, b.mode, b.mtime) {
            return Ok(h);
        }
        let moved = Arc::new(Handle { snap: last, entry });
        self.handles.lock().unwrap().insert(fh.0, moved.clone());
        Ok(moved)
    }

    fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.handles.lock().unwrap().insert(fh, Arc::new(h));
        FileHandle(fh)
    }

    /// The entry at `ino` in the current snapshot.
    async fn resolve(&self, ino: INodeNo) -> Result<(Arc<Snapshot>, u32), Errno> {
        let path = self.path_of(ino)?;
        let snap = self.snapshot().await?;
        let entry = *snap.by_path.get(&path).ok_or(Errno::ENOENT)?;
        Ok((snap, entry))
    }

    fn attr(&self, ino: INodeNo, e: &Entry) -> FileAttr {
        let mtime = system_time(e.mtime);
        let (kind, size, nlink) = match &e.kind {
            EntryKind::File { size } => (FileType::RegularFile, *size, 1),
            EntryKind::Dir => (FileType::Directory, 0, 2),
            EntryKind::Symlink { target } => (FileType::Symlink, target.len() as u64, 1),
            // Not offered by a mount's session (each path comes as a file).
            EntryKind::HardLink { .. } => (FileType::RegularFile, 0, 1),
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm: (e.mode & 0o7777) as u16,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 128 << 10,
            flags: 0,
        }
    }
}

/// rename(2)'s errors for `from` → `to` as the snapshot shows them (the server checks
/// again, but its refusals carry no errno).
fn check_rename(snap: &Snapshot, from: &[u8], to: &[u8], noreplace: bool) -> Result<(), Errno> {
    let src = *snap.by_path.get(from).ok_or(Errno::ENOENT)?;
    if from.is_empty() || to.is_empty() {
        return Err(Errno::EBUSY);
    }
    let to_parent = *snap.by_path.get(parent_of(to)).ok_or(Errno::ENOENT)?;
    if snap.entry(to_parent).kind != EntryKind::Dir {
        return Err(Errno::ENOTDIR);
    }
    let src_dir = snap.entry(src).kind == EntryKind::Dir;
    if src_dir && to.len() > from.len() && to.starts_with(from) && to[from.len()] == b'/' {
        // Into itself.
        return Err(Errno::EINVAL);
    }
    let Some(&dst) = snap.by_path.get(to) else {
        return Ok(());
    };
    if noreplace && from != to {
        return Err(Errno::EEXIST);
    }
    match (src_dir, snap.entry(dst).kind == EntryKind::Dir) {
        (true, false) => Err(Errno::ENOTDIR),
        (false, true) => Err(Errno::EISDIR),
        (true, true) if from != to && !snap.remote.list(dst).is_empty() => Err(Errno::ENOTEMPTY),
        _ => Ok(()),
    }
}

/// The errno a failed change on the server gives: the file system's own when the
/// error carries one, else by the class of the server's refusal.
fn errno_of(e: &dmover_core::Error) -> Errno {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(n) = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.raw_os_error())
        {
            return Errno::from_i32(n);
        }
        source = s.source();
    }
    use dmover_proto::control::ErrorCode;
    match e.code() {
        ErrorCode::NotFound => Errno::ENOENT,
        ErrorCode::ReadOnly => Errno::EROFS,
        ErrorCode::PermissionDenied | ErrorCode::PathEscape | ErrorCode::Auth => Errno::EACCES,
        ErrorCode::Unsupported => Errno::EOPNOTSUPP,
        _ => Errno::EIO,
    }
}

fn system_time(t: dmover_proto::manifest::Mtime) -> SystemTime {
    if t.sec >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
            + Duration::from_nanos(t.nsec.into())
    }
}

fn file_type(e: &Entry) -> FileType {
    match e.kind {
        EntryKind::File { .. } | EntryKind::HardLink { .. } => FileType::RegularFile,
        EntryKind::Dir => FileType::Directory,
        EntryKind::Symlink { .. } => FileType::Symlink,
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn parent_of(path: &[u8]) -> &[u8] {
    path.iter()
        .rposition(|&c| c == b'/')
        .map_or(&[][..], |i| &path[..i])
}

/// The FUSE side: every request that may wait is a task on the runtime.
struct Fs {
    inner: Arc<Inner>,
    rt: tokio::runtime::Handle,
}

impl Fs {
    fn spawn<F>(&self, f: impl FnOnce(Arc<Inner>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(f(self.inner.clone()));
    }
}

impl Fs {
    /// unlink (`dir` false) or rmdir of `name` in `parent`: checked against the
    /// snapshot first (ENOENT, EISDIR, ENOTDIR, ENOTEMPTY), then deleted on the server
    /// ([`Client::remove_entry`], which checks again there).
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        if self.inner.rw.is_none() {
            return reply.error(Errno::EROFS);
        }
        let name = name.as_bytes().to_vec();
        self.spawn(|i| async move {
            let r = async {
                let path = join(&i.path_of(parent)?, &name);
                i.settled(&path).await?;
                let snap = i.snapshot().await?;
                let entry = *snap.by_path.get(&path).ok_or(Errno::ENOENT)?;
                match (&snap.entry(entry).kind, dir) {
                    (EntryKind::Dir, false) => return Err(Errno::EISDIR),
                    (EntryKind::Dir, true) => {
                        if !snap.remote.list(entry).is_empty() {
                            return Err(Errno::ENOTEMPTY);
                        }
                    }
                    (_, true) => return Err(Errno::ENOTDIR),
                    (_, false) => {}
                }
                let remote = i.remote_path(&path);
                i.changed(i.client.remove_entry(&i.server, &remote, dir))
                    .await
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }
}

impl Fs {
    /// truncate(2) of an existing remote file not open for writing here: rewritten
    /// whole at once, empty (`size` 0) or fetched and cut (as an open without
    /// `O_TRUNC`), and uploaded before the reply.
    fn truncate(&self, ino: INodeNo, size: u64, reply: ReplyAttr) {
        self.spawn(|i| async move {
            let r = async {
                let path = i.path_of(ino)?;
                let (snap, entry) = i.resolve(ino).await?;
                let w = i.rewrite(&snap, entry, &path, Some(size), 0).await?;
                let r = i.flush_writer(&w).await.and_then(|()| i.writer_attr(&w));
                i.drop_writer(&w);
                r
            }
            .await;
            match r {
                Ok(attr) => reply.attr(&i.ttl, &attr),
                Err(e) => reply.error(e),
            }
        });
    }
}

impl fuser::Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Larger kernel read-ahead, so a sequential read asks for more at once (the
        // session reads ahead by chunks too).
        if let Err(max) = config.set_max_readahead(4 << 20) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        if self.inner.rw.is_some() {
            // open(O_TRUNC) arrives as one open with the flag (else as a truncation
            // followed by an open, which would upload an empty file first).
            let _ = config.add_capabilities(fuser::InitFlags::FUSE_ATOMIC_O_TRUNC);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.as_bytes().to_vec();
        self.spawn(|i| async move {
            let r = async {
                let dir = i.path_of(parent)?;
                let path = join(&dir, &name);
                if let Some(w) = i.writer_at(&path) {
                    return i.writer_attr(&w);
                }
                let snap = i.snapshot().await?;
                let entry = *snap.by_path.get(&path).ok_or(Errno::ENOENT)?;
                Ok::<_, Errno>(i.attr(i.ino(&path), snap.entry(entry)))
            }
            .await;
            match r {
                Ok(attr) => reply.entry(&i.ttl, &attr, Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.spawn(|i| async move {
            let r = async {
                if let Some(w) = i.writer_of(ino) {
                    return i.writer_attr(&w);
                }
                if let Some(h) = fh.and_then(|fh| i.handle(fh).ok()) {
                    return Ok(i.attr(ino, h.snap.entry(h.entry)));
                }
                let (snap, entry) = i.resolve(ino).await?;
                Ok::<_, Errno>(i.attr(ino, snap.entry(entry)))
            }
            .await;
            match r {
                Ok(attr) => reply.attr(&i.ttl, &attr),
                Err(e) => reply.error(e),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(|i| async move {
            match i.resolve(ino).await {
                Ok((snap, entry)) => match &snap.entry(entry).kind {
                    EntryKind::Symlink { target } => reply.data(target),
                    _ => reply.error(Errno::EINVAL),
                },
                Err(e) => reply.error(e),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if let Some(w) = self.inner.writer_of(ino) {
            // A file created here and still open: its staging file, read or written.
            w.opens.fetch_add(1, Relaxed);
            let fh = self.inner.next_fh.fetch_add(1, Relaxed);
            self.inner.writer_fhs().insert(fh, w);
            return reply.opened(FileHandle(fh), FopenFlags::empty());
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            if self.inner.rw.is_none() {
                return reply.error(Errno::EROFS);
            }
            // An existing remote file is rewritten whole: into a staging file (empty
            // with O_TRUNC, else fetched first), uploaded at close (docs/remote.md).
            let trunc = flags.0 & libc::O_TRUNC != 0;
            return self.spawn(|i| async move {
                let r = async {
                    let path = i.path_of(ino)?;
                    let (snap, entry) = i.resolve(ino).await?;
                    if let Some(w) = i.writer_at(&path) {
                        // Opened by another writer meanwhile.
                        w.opens.fetch_add(1, Relaxed);
                        if trunc {
                            w.file.file().set_len(0).map_err(Errno::from)?;
                            w.dirty.store(true, Relaxed);
                        }
                        return Ok(w);
                    }
                    i.rewrite(&snap, entry, &path, trunc.then_some(0), 1).await
                }
                .await;
                match r {
                    Ok(w) => {
                        let fh = i.next_fh.fetch_add(1, Relaxed);
                        i.writer_fhs().insert(fh, w);
                        reply.opened(FileHandle(fh), FopenFlags::empty())
                    }
                    Err(e) => reply.error(e),
                }
            });
        }
        self.spawn(|i| async move {
            match i.resolve(ino).await {
                Ok((snap, entry)) => match snap.entry(entry).kind {
                    EntryKind::File { .. } => {
                        let fh = i.add_handle(Handle { snap, entry });
                        reply.opened(fh, FopenFlags::empty());
                    }
                    EntryKind::Dir => reply.error(Errno::EISDIR),
                    EntryKind::Symlink { .. } => reply.error(Errno::ELOOP),
                    EntryKind::HardLink { .. } => reply.error(Errno::EOPNOTSUPP),
                },
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        if let Some(w) = self.inner.writer_fh(fh) {
            let mut buf = vec![0; size as usize];
            let mut n = 0;
            while n < buf.len() {
                match w.file.file().read_at(&mut buf[n..], offset + n as u64) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) => return reply.error(e.into()),
                }
            }
            return reply.data(&buf[..n]);
        }
        let h = match self.inner.file(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        self.spawn(|i| async move {
            let read = h.snap.remote.read_at(h.entry, offset, size.into());
            match tokio::time::timeout(i.timeout, read).await {
                Ok(Ok(data)) => reply.data(&data),
                Ok(Err(e)) => {
                    tracing::warn!(
                        "reading {}: {e}",
                        String::from_utf8_lossy(&h.snap.paths[h.entry as usize])
                    );
                    reply.error(Errno::EIO)
                }
                Err(_) => {
                    tracing::warn!("a read got no answer within {:?}", i.timeout);
                    reply.error(Errno::EIO)
                }
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let w = self.inner.writer_fhs().remove(&fh.0);
        let Some(w) = w else {
            self.inner.handles.lock().unwrap().remove(&fh.0);
            return reply.ok();
        };
        if w.opens.fetch_sub(1, Relaxed) > 1 {
            return reply.ok();
        }
        // The last handle: upload what no flush did, then forget the staging file (the
        // server's copy is what lookups see from now on).
        self.spawn(|i| async move {
            let r = i.flush_writer(&w).await;
            i.drop_writer(&w);
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        if self.inner.rw.is_none() {
            return reply.error(Errno::EROFS);
        }
        let name = name.as_bytes().to_vec();
        self.spawn(|i| async move {
            let r = async {
                let path = join(&i.path_of(parent)?, &name);
                if i.writer_at(&path).is_some() {
                    return Err(Errno::EEXIST);
                }
                let w = i.new_writer(&path, mode & !umask, true, 1)?;
                let fh = i.next_fh.fetch_add(1, Relaxed);
                i.writer_fhs().insert(fh, w.clone());
                Ok((i.writer_attr(&w)?, FileHandle(fh)))
            }
            .await;
            match r {
                Ok((attr, fh)) => {
                    reply.created(&i.ttl, &attr, Generation(0), fh, FopenFlags::empty())
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        let Some(w) = self.inner.writer_fh(fh) else {
            return reply.error(self.inner.unsupported());
        };
        match w.file.file().write_all_at(data, offset) {
            Ok(()) => {
                w.dirty.store(true, Relaxed);
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(e.into()),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Only files being written change (size, mode, mtime travel with the upload).
        let Some(w) = self.inner.writer_of(ino) else {
            return match (size, mode, uid, gid, mtime) {
                (Some(size), None, None, None, None) if self.inner.rw.is_some() => {
                    self.truncate(ino, size, reply)
                }
                _ => reply.error(self.inner.unsupported()),
            };
        };
        if uid.is_some_and(|u| u != self.inner.uid) || gid.is_some_and(|g| g != self.inner.gid) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let r = (|| {
            if let Some(size) = size {
                w.file.file().set_len(size)?;
            }
            if let Some(mode) = mode {
                use std::os::unix::fs::PermissionsExt;
                w.file
                    .file()
                    .set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if let Some(t) = mtime {
                w.file.file().set_modified(match t {
                    fuser::TimeOrNow::SpecificTime(t) => t,
                    fuser::TimeOrNow::Now => SystemTime::now(),
                })?;
            }
            Ok::<_, std::io::Error>(())
        })();
        match r.map_err(Errno::from).and_then(|()| {
            w.dirty.store(true, Relaxed);
            self.inner.writer_attr(&w)
        }) {
            Ok(attr) => reply.attr(&self.inner.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let Some(dir) = self.inner.rw.as_ref().map(|d| d.path().to_path_buf()) else {
            return reply.error(Errno::EROFS);
        };
        let name = name.as_bytes().to_vec();
        self.spawn(|i| async move {
            let r = async {
                let path = join(&i.path_of(parent)?, &name);
                let snap = i.snapshot().await?;
                if snap.by_path.contains_key(&path) || i.writer_at(&path).is_some() {
                    return Err(Errno::EEXIST);
                }
                // An empty directory pushed to the path creates it there.
                let empty = tempfile::Builder::new()
                    .prefix(".dir-")
                    .tempdir_in(&dir)
                    .map_err(Errno::from)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(
                    empty.path(),
                    std::fs::Permissions::from_mode(mode & !umask & 0o7777),
                )
                .map_err(Errno::from)?;
                i.upload(empty.path(), &path).await?;
                let snap = i.snapshot().await?;
                let entry = *snap.by_path.get(&path).ok_or(Errno::EIO)?;
                Ok(i.attr(i.ino(&path), snap.entry(entry)))
            }
            .await;
            match r {
                Ok(attr) => reply.entry(&i.ttl, &attr, Generation(0)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        if self.inner.rw.is_none() {
            return reply.error(Errno::EROFS);
        }
        let noreplace = flags.contains(fuser::RenameFlags::RENAME_NOREPLACE);
        if !(flags - fuser::RenameFlags::RENAME_NOREPLACE).is_empty() {
            // RENAME_EXCHANGE, RENAME_WHITEOUT: not offered.
            return reply.error(Errno::EINVAL);
        }
        let (name, newname) = (name.as_bytes().to_vec(), newname.as_bytes().to_vec());
        self.spawn(|i| async move {
            let r = async {
                let from = join(&i.path_of(parent)?, &name);
                let to = join(&i.path_of(newparent)?, &newname);
                i.settled(&from).await?;
                i.settled(&to).await?;
                let snap = i.snapshot().await?;
                check_rename(&snap, &from, &to, noreplace)?;
                if from == to {
                    return Ok(());
                }
                let (rfrom, rto) = (i.remote_path(&from), i.remote_path(&to));
                i.changed(i.client.rename_remote(&i.server, &rfrom, &rto))
                    .await?;
                i.inodes.lock().unwrap().rename(&from, &to);
                Ok(())
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(self.inner.unsupported());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(|i| async move {
            match i.resolve(ino).await {
                Ok((snap, entry)) => match snap.entry(entry).kind {
                    EntryKind::Dir => {
                        let fh = i.add_handle(Handle { snap, entry });
                        reply.opened(fh, FopenFlags::empty());
                    }
                    _ => reply.error(Errno::ENOTDIR),
                },
                Err(e) => reply.error(e),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // The listing of the snapshot the directory was opened in: consistent offsets
        // across the calls of one listing, and no network wait here.
        let h = match self.inner.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let i = &self.inner;
        let path = &h.snap.paths[h.entry as usize];
        let parent = if h.entry == h.snap.root {
            INodeNo::ROOT
        } else {
            i.ino(parent_of(path))
        };
        let kids = h.snap.remote.list(h.entry);
        let all = [
            (ino, FileType::Directory, &b"."[..]),
            (parent, FileType::Directory, b".."),
        ]
        .into_iter()
        .chain(kids.iter().map(|&k| {
            let e = h.snap.entry(k);
            (
                i.ino(&h.snap.paths[k as usize]),
                file_type(e),
                e.name.as_slice(),
            )
        }));
        for (n, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(ino, n as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.inner.handles.lock().unwrap().remove(&fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() waits for the flush: a new file is uploaded here, and a failed upload
        // is close()'s error.
        let Some(w) = self.inner.writer_fh(fh) else {
            return reply.ok();
        };
        self.spawn(|i| async move {
            match i.flush_writer(&w).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // No extended attributes travel: ENOSYS tells the kernel not to ask again.
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let last = self.inner.last.lock().unwrap().clone();
        let (bytes, files) = last.map_or((0, 0), |s| {
            let e = s.remote.entries();
            (e.iter().map(Entry::file_size).sum::<u64>(), e.len() as u64)
        });
        reply.statfs(bytes.div_ceil(4096), 0, 0, files, 0, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.contains(fuser::AccessFlags::W_OK) && self.inner.rw.is_none() {
            reply.error(Errno::EROFS);
        } else {
            reply.ok();
        }
    }
}
