//! Operations on a server's files, each a request of its own: removing entries
//! ([`Op::Prune`] with filters that name them), renaming ([`Op::Rename`]) and a
//! directory's modification time (a pull's manifest).

use dmover_proto::control::{self, ErrorCode, Op, Prune, PruneReport};
use dmover_proto::manifest::{Entry, NO_PARENT};

use super::Client;
use crate::error::{Error, Result};

impl Client {
    /// Deletes the entry `name` (a file, or a directory with what it holds) directly in
    /// the directory `dir` on `server`, and nothing else, with [`Op::Prune`]: the
    /// mirror is `dir`, the manifest its root alone, the filters include `/name` (and
    /// what is below it) and exclude everything else, and at most `max_delete`
    /// entries go. `dry_run`: only checks that the server would let this client delete
    /// there (a writable export, write rights). `dir` may be an export's root (the
    /// server prunes one only for rules that name entries, as these do). After a
    /// deletion the server gives `dir` the mtime `dir_mtime` (as a sync's mirror gets
    /// its source's): pass the one it had. For `dmover tune`'s test files.
    pub async fn remove_remote(
        &self,
        server: &str,
        dir: &[u8],
        name: &[u8],
        dir_mtime: dmover_proto::manifest::Mtime,
        max_delete: u64,
        dry_run: bool,
    ) -> Result<PruneReport> {
        // The name goes into filter rules: no path; what a pattern would read as a
        // wildcard or an escape is escaped.
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                format!(
                    "{:?}: not a plain name to remove",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        let mut anchored = b"/".to_vec();
        for &b in name {
            if b"*?[]\\".contains(&b) {
                anchored.push(b'\\');
            }
            anchored.push(b);
        }
        let mut below = anchored.clone();
        below.extend_from_slice(b"/***");
        let req = Prune {
            dest: dir.to_vec(),
            // `/name/***` matches `name` only as a directory.
            rules: vec![
                control::FilterRule {
                    include: true,
                    pattern: anchored,
                },
                control::FilterRule {
                    include: true,
                    pattern: below,
                },
                control::FilterRule {
                    include: false,
                    pattern: b"*".to_vec(),
                },
            ],
            max_delete,
            dry_run,
            conflicts_only: false,
            checksum: false,
        };
        let root = Entry {
            parent: NO_PARENT,
            name: b"dir".to_vec(),
            kind: dmover_proto::manifest::EntryKind::Dir,
            mode: 0o755,
            mtime: dir_mtime,
        };
        self.prune_remote(server, &[root], req).await
    }

    /// Deletes `name` (a file, or a directory and everything below it) in the directory `dir` on
    /// `server`: an [`Op::Prune`] of `dir` against a manifest of `dir` alone, whose
    /// filters protect everything but `name`. A dry run goes first and must list
    /// nothing outside `name`, else nothing is deleted. `dir` cannot be an export's
    /// root (the server refuses a prune there). `dir` gets `mtime` when something was
    /// deleted (a prune gives a directory it changed the manifest's mtime: pass the one
    /// `dir` had before, see [`Client::dir_mtime`]). Returns the entries deleted; with
    /// nothing to delete it only checks that the server would allow it.
    /// (`dmover bench remote` removes its test files with it.)
    pub async fn remove_in(
        &self,
        server: &str,
        dir: &[u8],
        name: &[u8],
        mtime: dmover_proto::manifest::Mtime,
    ) -> Result<u64> {
        let dry = self
            .remove_remote(server, dir, name, mtime, u64::MAX, true)
            .await?;
        let inside =
            |p: &[u8]| p.starts_with(name) && matches!(p.get(name.len()), None | Some(b'/'));
        if let Some(p) = dry.paths.iter().find(|p| !inside(p)) {
            return Err(Error::protocol(
                server,
                format!(
                    "removing {:?} would also delete {:?}: nothing deleted",
                    String::from_utf8_lossy(name),
                    String::from_utf8_lossy(p)
                ),
            ));
        }
        if dry.deleted == 0 {
            return Ok(0);
        }
        let done = self
            .remove_remote(server, dir, name, mtime, dry.deleted, false)
            .await?;
        Ok(done.deleted)
    }

    /// The catalog checksums `types` (`adler32`, `md5`, `crc32c`) of the regular file
    /// `path` on `server` ([`Op::Sums`], feature bit `SUMS`; docs/checksums.md), from
    /// its cache there or read (and cached, where the user may write) by the server;
    /// `cache` false reads the file and leaves the cache alone.
    pub async fn sums_remote(
        &self,
        server: &str,
        path: &[u8],
        types: Vec<String>,
        cache: bool,
    ) -> Result<control::SumsReport> {
        let conn = self.connect(server).await?;
        let mut open = self.open_request(
            Op::Sums(control::Sums {
                path: path.to_vec(),
                types,
                cache,
            }),
            0,
        );
        open.features |= dmover_proto::session::features::SUMS;
        conn.sums(server, open, self.opts.session_options(false))
            .await
            .map_err(|e| match e {
                // As for `--size-only` on a push: the code is read, not the words.
                Error::Remote {
                    peer,
                    code: ErrorCode::Protocol,
                    message,
                } => Error::Remote {
                    message: format!(
                        "{message} (dmover sum of a server's file needs the server to speak \
                         protocol feature {}, \"catalog checksums\": upgrade {peer})",
                        dmover_proto::session::features::SUMS
                    ),
                    peer,
                    code: ErrorCode::Protocol,
                },
                e => e,
            })
    }

    /// Renames the entry `from` to `to` on `server` ([`Op::Rename`]): rename(2) there,
    /// both paths in one export and confined beneath it, with the user's write rights;
    /// an existing `to` is replaced atomically (a directory only if it is empty). For
    /// `dmover mount --rw` (docs/remote.md).
    pub async fn rename_remote(&self, server: &str, from: &[u8], to: &[u8]) -> Result<()> {
        let conn = self.connect(server).await?;
        let open = self.open_request(
            Op::Rename(control::Rename {
                from: from.to_vec(),
                to: to.to_vec(),
            }),
            0,
        );
        conn.rename(server, open, self.opts.session_options(false))
            .await
    }

    /// Removes the one entry `path` on `server` as unlink(2) (`dir` false: a file or a
    /// symlink) or rmdir(2) (`dir`: an empty directory) would, with
    /// [`Client::remove_remote`] in its parent: a dry run must list exactly that entry,
    /// else nothing is deleted (missing: [`ErrorCode::NotFound`]; EISDIR, ENOTDIR or
    /// ENOTEMPTY as an I/O error), then the prune deletes at most that one entry. The
    /// parent gets the current time as its mtime, as unlink gives it. The parent may be
    /// an export's root; a pattern's characters in the name (`*?[]\`) are escaped.
    /// For `dmover mount --rw` (docs/remote.md).
    pub async fn remove_entry(&self, server: &str, path: &[u8], dir: bool) -> Result<()> {
        let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mtime = dmover_proto::manifest::Mtime {
            sec: now.as_secs() as i64,
            nsec: now.subsec_nanos(),
        };
        let dry = self
            .remove_remote(server, parent, name, mtime, u64::MAX, true)
            .await?;
        let mut as_dir = name.to_vec();
        as_dir.push(b'/');
        let shown = String::from_utf8_lossy(path).into_owned();
        let refuse = |errno: i32| {
            Error::io(
                "removing",
                shown.clone(),
                std::io::Error::from_raw_os_error(errno),
            )
        };
        match (dry.paths.as_slice(), dir) {
            ([], _) => {
                return Err(Error::refused(
                    ErrorCode::NotFound,
                    format!("{shown}: no such file or directory"),
                ));
            }
            ([p], false) if p == name => {}
            ([p], true) if *p == as_dir => {}
            (_, false) => return Err(refuse(libc::EISDIR)),
            ([p], true) if p == name => return Err(refuse(libc::ENOTDIR)),
            (_, true) => return Err(refuse(libc::ENOTEMPTY)),
        }
        self.remove_remote(server, parent, name, mtime, 1, false)
            .await?;
        Ok(())
    }

    /// The modification time of the directory `dir` on `server` (its manifest without
    /// its contents: a pull whose filters exclude everything below it), or an error if
    /// it is not a directory.
    pub async fn dir_mtime(
        &self,
        server: &str,
        dir: &[u8],
    ) -> Result<dmover_proto::manifest::Mtime> {
        let mut opts = self.opts.clone();
        opts.rules = vec![control::FilterRule {
            include: false,
            pattern: b"*".to_vec(),
        }];
        let c = Client::new(opts, 1);
        let r = crate::remote::Remote::open(&c, server, dir).await?;
        let root = r.roots().first().and_then(|&i| r.stat(i)).cloned();
        let _ = r.close().await;
        match root {
            Some(e) if e.kind == dmover_proto::manifest::EntryKind::Dir => Ok(e.mtime),
            _ => Err(Error::refused(
                control::ErrorCode::Unsupported,
                format!("{}: not a directory", String::from_utf8_lossy(dir)),
            )),
        }
    }
}
