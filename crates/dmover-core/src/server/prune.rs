//! `dmover sync --delete` and `--dry-run` on a push, the server's part ([`Op::Prune`],
//! docs/sync.md): the client sends its source's manifest; the server deletes what the
//! mirror holds that the manifest does not list, or in a dry run only reports it.
//! Also `dmover sync --checksum` on a pull ([`Op::Digests`]): the content digests of
//! the source's files that the client's mirror holds with the same size.

use dmover_proto::control::{Digests, FilterRule, Keep, Prune, PruneKeep, PruneReport};
use dmover_proto::manifest::{self, Entry, Validator};
use dmover_store::prune::QuickCheck;

use super::*;
use crate::manifests::Charge;

impl Server {
    /// [`Op::Prune`]: reads the manifest behind `Options`, prunes the mirror
    /// `req.dest` (the user needs write rights on a writable export, also for a dry
    /// run, which tells what the real run would do) and answers [`Control::Pruned`].
    pub(super) async fn prune<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        grant: &Grant,
        req: Prune,
        log: &mut SessionLog,
    ) -> Result<()> {
        self.prune_keeping(ch, grant, req, None, log).await
    }

    /// [`Op::PruneKeep`]: [`Server::prune`], answering in `unchanged` the regular files
    /// the mirror keeps as `keep` says (dry run or not).
    pub(super) async fn prune_keep<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        grant: &Grant,
        req: PruneKeep,
        log: &mut SessionLog,
    ) -> Result<()> {
        if req.prune.checksum {
            return Err(refused(
                ErrorCode::Protocol,
                "a prune that keeps files by size or existence does not take checksum",
            ));
        }
        self.prune_keeping(ch, grant, req.prune, Some(req.keep), log)
            .await
    }

    async fn prune_keeping<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        grant: &Grant,
        req: Prune,
        keep: Option<Keep>,
        log: &mut SessionLog,
    ) -> Result<()> {
        self.options(ch).await?;
        // A capability allows this only for a sync between servers into `req.dest`.
        Self::check_scope(grant, &Op::Prune(req.clone()))?;
        let filter = crate::session::filter_of_rules(&req.rules)?;
        let policy = self.policy.borrow().clone();
        let (_, base, rest, _) = policy.resolve(self.cfg.read_only, grant, &req.dest, true)?;
        let rest = rest.to_vec();
        log.what = format!(
            "{}prune of {:?}",
            if req.dry_run { "dry-run " } else { "" },
            String::from_utf8_lossy(&req.dest)
        );
        // A prune needs write rights: it gets a push's manifest limit.
        let (entries, _charge) = self
            .read_manifest(ch, self.cfg.max_manifest_bytes, "max_manifest_bytes")
            .await?;
        let opts = dmover_store::prune::PruneOptions {
            filter,
            max_delete: (req.max_delete != u64::MAX).then_some(req.max_delete),
            dry_run: req.dry_run,
            conflicts_only: req.conflicts_only,
            checksum: req.checksum,
            quick: match keep {
                None => QuickCheck::SizeAndMtime,
                Some(Keep::SameSize) => QuickCheck::Size,
                Some(Keep::Existing) => QuickCheck::Exists,
            },
        };
        let named_only = names_only(&req.rules);
        let pruned = self
            .disk
            .run(move || {
                let Some((parent, name)) = paths::dest_parent(&base, &rest)? else {
                    // An export's root is no mirror; but one named entry in it may be
                    // deleted (unlink and rmdir through a mount).
                    if !named_only {
                        return Err(dmover_store::Error::refused(
                            ErrorCode::PermissionDenied,
                            "sync: the mirror cannot be an export's root",
                        ));
                    }
                    let root = base
                        .open_dir(b"")
                        .map_err(|e| dmover_store::Error::io("opening", "the export", e))?;
                    return dmover_store::prune::prune(&root, b".", &entries, &opts);
                };
                dmover_store::prune::prune(&parent, &name, &entries, &opts)
            })
            .await
            .ok_or(Error::Aborted)??;
        if !req.dry_run && pruned.deleted > 0 {
            tracing::info!(
                "{}: deleted {} entries ({} bytes) in {:?} for user {:?}",
                ch.peer(),
                pruned.deleted,
                pruned.deleted_bytes,
                String::from_utf8_lossy(&req.dest),
                grant.user
            );
        }
        ch.send(&Control::Pruned(session::prune_report(pruned)))
            .await?;
        Ok(())
    }

    /// [`Op::Digests`]: reads the client's manifest of its mirror behind `Options` and
    /// answers [`Control::Pruned`] with the content digest of each regular file the
    /// source `req.source` holds with the size that manifest gives it (read rights
    /// suffice; nothing changes).
    pub(super) async fn digests<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        grant: &Grant,
        req: Digests,
        log: &mut SessionLog,
    ) -> Result<()> {
        self.options(ch).await?;
        // A capability allows this only for a sync between servers from `req.source`.
        Self::check_scope(grant, &Op::Digests(req.clone()))?;
        let policy = self.policy.borrow().clone();
        let (_, base, rest, _) = policy.resolve(self.cfg.read_only, grant, &req.source, false)?;
        let rest = rest.to_vec();
        log.what = format!("digests of {:?}", String::from_utf8_lossy(&req.source));
        // Read rights suffice: the smaller limit of the ops a read-only user can run.
        let (entries, _charge) = self
            .read_manifest(
                ch,
                self.cfg.max_manifest_bytes_read,
                "max_manifest_bytes_read",
            )
            .await?;
        let opts = dmover_store::prune::PruneOptions {
            dry_run: true,
            conflicts_only: true,
            checksum: true,
            ..Default::default()
        };
        let digests = self
            .disk
            .run(move || {
                // The source as a pull resolves it: with a trailing slash (or an
                // export's root) the directory itself, else the entry in its parent,
                // not followed.
                let dir_itself = rest.len() > 1 && rest.ends_with(b"/");
                let pruned = match paths::dest_parent(&base, &rest)? {
                    Some((parent, name)) if !dir_itself => {
                        dmover_store::prune::prune(&parent, &name, &entries, &opts)?
                    }
                    _ => {
                        let dir = base.open_dir(&rest).map_err(|e| {
                            dmover_store::Error::io("opening", String::from_utf8_lossy(&rest), e)
                        })?;
                        dmover_store::prune::prune(&dir, b".", &entries, &opts)?
                    }
                };
                Ok::<_, dmover_store::Error>(pruned.digests)
            })
            .await
            .ok_or(Error::Aborted)??;
        ch.send(&Control::Pruned(PruneReport {
            digests,
            ..Default::default()
        }))
        .await?;
        Ok(())
    }

    /// `Manifest* ManifestEnd`, checked as a session's sink checks it, of at most
    /// `limit` bytes of memory (the config key `key`), charged to the server's
    /// manifest budget for as long as the returned charge is held.
    async fn read_manifest<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        ch: &mut ControlChannel<S>,
        limit: u64,
        key: &str,
    ) -> Result<(Vec<Entry>, Charge)> {
        let peer = ch.peer().to_string();
        let mut v = Validator::new();
        let mut entries = Vec::new();
        let mut bytes = 0u64;
        let mut charge = Charge::new(self.manifests.clone());
        loop {
            match ch
                .recv_timeout(self.cfg.handshake_timeout, "manifest")
                .await?
            {
                Control::Manifest(part) => {
                    v.extend(&part.entries, self.cfg.max_entries)
                        .map_err(|e| refused(ErrorCode::Protocol, e.to_string()))?;
                    bytes += part.entries.iter().map(manifest::entry_bytes).sum::<u64>();
                    if bytes > limit {
                        return Err(refused(
                            ErrorCode::Unsupported,
                            format!(
                                "the manifest takes more than this server's limit for this \
                                 op ({}, {key} in its config)",
                                crate::manifests::size(limit)
                            ),
                        ));
                    }
                    charge.grow_to(bytes)?;
                    entries.extend(part.entries);
                }
                Control::ManifestEnd(end) => {
                    if end.totals != manifest::Totals::of(&entries) {
                        return Err(refused(
                            ErrorCode::Protocol,
                            "the manifest's totals do not match its entries",
                        ));
                    }
                    return Ok((entries, charge));
                }
                other => return Err(session::unexpected(&peer, other, "Manifest")),
            }
        }
    }
}

/// Whether `rules` protect everything but entries they name in the mirror itself:
/// includes of `/NAME` or `/NAME/***` (a plain name), then an exclude of `*` — what
/// [`crate::client::Client::remove_remote`] sends. Only such a prune may run on an
/// export's root: it cannot delete anything the client did not name.
fn names_only(rules: &[FilterRule]) -> bool {
    let Some((last, named)) = rules.split_last() else {
        return false;
    };
    // `/NAME`: a name whose wildcard characters (and backslashes) are all escaped.
    let plain = |p: &[u8]| {
        let p = p.strip_suffix(b"/***").unwrap_or(p);
        let Some(n) = p.strip_prefix(b"/") else {
            return false;
        };
        let mut name = Vec::with_capacity(n.len());
        let mut it = n.iter();
        while let Some(&b) = it.next() {
            match b {
                b'\\' => match it.next() {
                    Some(&c) => name.push(c),
                    None => return false,
                },
                b'*' | b'?' | b'[' | b']' => return false,
                c => name.push(c),
            }
        }
        !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/')
    };
    !last.include
        && last.pattern == b"*"
        && !named.is_empty()
        && named.iter().all(|r| r.include && plain(&r.pattern))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(include: bool, p: &str) -> FilterRule {
        FilterRule {
            include,
            pattern: p.as_bytes().to_vec(),
        }
    }

    #[test]
    fn only_named_entries_may_be_pruned_at_an_export_root() {
        let named = [rule(true, "/a"), rule(true, "/a/***"), rule(false, "*")];
        assert!(names_only(&named));
        for bad in [
            vec![],
            vec![rule(false, "*")],
            vec![rule(true, "/a")],
            vec![rule(true, "/a"), rule(false, "*.c")],
            vec![rule(true, "a"), rule(false, "*")],
            vec![rule(true, "/*"), rule(false, "*")],
            vec![rule(true, "/a/b"), rule(false, "*")],
            vec![rule(true, "/.."), rule(false, "*")],
            vec![rule(true, "/a/**"), rule(false, "*")],
            vec![rule(false, "/a"), rule(false, "*")],
            vec![rule(true, "/a\\"), rule(false, "*")],
            vec![rule(true, "/a\\/b"), rule(false, "*")],
            vec![rule(true, "/\\.\\."), rule(false, "*")],
            vec![rule(true, "/a*\\?"), rule(false, "*")],
        ] {
            assert!(!names_only(&bad), "{bad:?}");
        }
        // Wildcard characters and backslashes escaped: a plain name, which the filter
        // matches alone.
        let escaped = "/x\\*\\[1\\]\\?\\\\y";
        let named = [
            rule(true, escaped),
            rule(true, &format!("{escaped}/***")),
            rule(false, "*"),
        ];
        assert!(names_only(&named));
        let f = dmover_store::filter::Rule::new(
            dmover_store::filter::Action::Include,
            escaped.as_bytes(),
        )
        .unwrap();
        assert!(f.matches(b"x*[1]?\\y", false));
        assert!(!f.matches(b"xa1b\\y", false) && !f.matches(b"x*1?y", false));
    }
}
