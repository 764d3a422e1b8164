//! `dmover sum dmover://HOST/PATH`, the server's part ([`Op::Sums`],
//! docs/checksums.md): the catalog checksums of one regular file of an export, with
//! the user's read rights, reached beneath the export as a pull's source is.

use dmover_proto::control::{Sums, SumsReport};
use dmover_store::catalog::{CacheUse, ChecksumType, sum_file};
use rustix::io::Errno;

use super::*;

/// Most types one request names.
const MAX_TYPES: usize = 8;

impl Server {
    /// [`Op::Sums`]: opens `req.path` beneath its export (not following a last
    /// symlink; a regular file only), answers from the file's cache or reads it, stores
    /// what it read in the cache where the user may write the export, and answers
    /// [`Control::Sums`].
    pub(super) async fn sums<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        grant: &Grant,
        req: Sums,
        log: &mut SessionLog,
    ) -> Result<()> {
        self.options(ch).await?;
        if grant.scope.is_some() {
            return Err(refused(
                ErrorCode::PermissionDenied,
                "a third-party capability does not allow checksums",
            ));
        }
        if req.types.is_empty() || req.types.len() > MAX_TYPES {
            return Err(refused(
                ErrorCode::Protocol,
                format!(
                    "{} checksum types asked (1 to {MAX_TYPES})",
                    req.types.len()
                ),
            ));
        }
        let types = req
            .types
            .iter()
            .map(|t| t.parse::<ChecksumType>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| refused(ErrorCode::Unsupported, e))?;
        let types = dmover_store::catalog::unique(&types);
        let policy = self.policy.borrow().clone();
        let read_only = self.cfg.read_only;
        let (_, base, rest, _) = policy.resolve(read_only, grant, &req.path, false)?;
        // The cache is stored only where the user could write the file's export.
        let writable = policy.resolve(read_only, grant, &req.path, true).is_ok();
        let cache = CacheUse {
            read: req.cache,
            store: req.cache && writable,
        };
        let rest = rest.to_vec();
        let shown = String::from_utf8_lossy(&req.path).into_owned();
        log.what = format!("checksums of {shown:?}");
        let shown2 = shown.clone();
        let report = self
            .disk
            .run(move || -> Result<_> {
                let not_regular = || {
                    refused(
                        ErrorCode::Unsupported,
                        format!("{shown2}: not a regular file"),
                    )
                };
                let (parent, name) = paths::dest_parent(&base, &rest)?.ok_or_else(not_regular)?;
                let fd = dmover_store::sys::open_regular(&parent, &name).map_err(|e| {
                    match Errno::from_io_error(&e) {
                        Some(Errno::NOENT) => refused(
                            ErrorCode::NotFound,
                            format!("{shown2}: no such file or directory"),
                        ),
                        Some(Errno::ACCESS | Errno::PERM) => refused(
                            ErrorCode::PermissionDenied,
                            format!("{shown2}: permission denied"),
                        ),
                        // A symlink (not followed) or a directory.
                        Some(Errno::LOOP | Errno::ISDIR) => not_regular(),
                        _ if dmover_store::sys::is_not_regular(&e) => not_regular(),
                        _ => dmover_store::Error::io("opening", &shown2, e).into(),
                    }
                })?;
                let file = std::fs::File::from(fd);
                sum_file(&file, &types, cache)
                    .map_err(|e| dmover_store::Error::io("reading", &shown2, e).into())
            })
            .await
            .ok_or(Error::Aborted)??;
        ch.send(&Control::Sums(SumsReport {
            size: report.size,
            sums: report
                .sums
                .iter()
                .map(|s| (s.kind().name().to_string(), s.to_string()))
                .collect(),
            cached: report.cached,
            stored: report.stored,
        }))
        .await?;
        Ok(())
    }
}
