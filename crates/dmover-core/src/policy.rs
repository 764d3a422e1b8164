//! The exports and users a server enforces, and their reload (`dmover serve` on
//! SIGHUP, [`Server::reload`](crate::server::Server::reload)): the policy in force sits behind a `watch` channel;
//! a connection authenticates against the policy of the moment, and each running
//! session checks itself against every new one ([`watch`]), ending with "credential
//! revoked" when its user is gone, the credential it proved is no longer its user's,
//! or its rights no longer cover what it does on its paths. Nothing on the per-chunk
//! path.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use dmover_proto::control::ErrorCode;
use dmover_store::paths::Base;
use rustix::fs::OFlags;
use tokio::sync::watch;

use crate::access::{ExportSpec, Grant, Rights, Users};
use crate::engine::Run;
use crate::error::{Error, Result};

/// An open export.
pub(crate) struct Export {
    pub(crate) spec: ExportSpec,
    pub(crate) root: Arc<OwnedFd>,
    /// What a pull of the whole export calls it.
    pub(crate) root_name: Vec<u8>,
}

/// The exports and users in force: replaced whole by [`Server::reload`](crate::server::Server::reload).
pub(crate) struct Policy {
    pub(crate) exports: Vec<Export>,
    pub(crate) users: Users,
}

/// Opens the exports `specs` names; an export `old` already has with the same name
/// and directory keeps its open directory.
pub(crate) fn open_exports(specs: &[ExportSpec], old: &[Export]) -> Result<Vec<Export>> {
    if specs.is_empty() {
        return Err(Error::refused(ErrorCode::NotFound, "no export to serve"));
    }
    let mut exports = Vec::new();
    for spec in specs {
        if let Some(e) = old
            .iter()
            .find(|e| e.spec.name == spec.name && e.spec.path == spec.path)
        {
            exports.push(Export {
                spec: spec.clone(),
                root: e.root.clone(),
                root_name: e.root_name.clone(),
            });
            continue;
        }
        let shown = spec.path.display().to_string();
        let root = dmover_store::sys::open_local(
            std::os::unix::ffi::OsStrExt::as_bytes(spec.path.as_os_str()),
            OFlags::PATH | OFlags::DIRECTORY,
        )
        .map_err(|e| Error::io("opening the export", &shown, e))?;
        let root_name = if spec.name.is_empty() {
            std::fs::canonicalize(&spec.path)
                .ok()
                .and_then(|p| {
                    p.file_name()
                        .map(|n| std::os::unix::ffi::OsStrExt::as_bytes(n).to_vec())
                })
                .unwrap_or_else(|| b"root".to_vec())
        } else {
            spec.name.clone().into_bytes()
        };
        exports.push(Export {
            spec: spec.clone(),
            root: Arc::new(root),
            root_name,
        });
    }
    let canonical: Vec<_> = specs
        .iter()
        .filter_map(|s| Some((s, std::fs::canonicalize(&s.path).ok()?)))
        .collect();
    for (outer, inner) in read_only_within_writable(&canonical) {
        tracing::warn!(
            "export {:?} contains export {:?}, which is read-only: a user with write rights \
             on {:?} can change {:?}'s files through it (read_only is per export, not per \
             directory; docs/protocol.md, \"Hardening\")",
            outer.name,
            inner.name,
            outer.name,
            inner.name
        );
    }
    Ok(exports)
}

/// The pairs (outer, inner) of exports, each given with its canonical path, where the
/// writable `outer` contains the read-only `inner`: writes through `outer` reach
/// `inner`'s files.
fn read_only_within_writable<'a>(
    exports: &[(&'a ExportSpec, std::path::PathBuf)],
) -> Vec<(&'a ExportSpec, &'a ExportSpec)> {
    let mut pairs = Vec::new();
    for (outer, op) in exports {
        for (inner, ip) in exports {
            if !outer.read_only && inner.read_only && ip != op && ip.starts_with(op) {
                pairs.push((*outer, *inner));
            }
        }
    }
    pairs
}

impl Policy {
    /// The policy `exports` and `users` make, replacing this one, and what changed.
    /// An export this one has with the same name and directory keeps its open
    /// directory. A server without authentication stays without, one with stays with.
    pub(crate) fn replaced(
        &self,
        exports: Vec<ExportSpec>,
        users: Users,
    ) -> Result<(Policy, Reloaded)> {
        if self.users.is_some() != users.is_some() {
            return Err(Error::refused(
                ErrorCode::Unsupported,
                "a reload cannot turn authentication on or off: restart the server",
            ));
        }
        let new = Policy {
            exports: open_exports(&exports, &self.exports)?,
            users,
        };
        let empty = BTreeMap::new();
        let (users_added, users_removed, users_changed) = changes(
            self.users.as_ref().unwrap_or(&empty),
            new.users.as_ref().unwrap_or(&empty),
        );
        let specs = |p: &Policy| -> BTreeMap<String, ExportSpec> {
            p.exports
                .iter()
                .map(|e| (e.spec.name.clone(), e.spec.clone()))
                .collect()
        };
        let (exports_added, exports_removed, exports_changed) = changes(&specs(self), &specs(&new));
        let changed = Reloaded {
            users_added,
            users_removed,
            users_changed,
            exports_added,
            exports_removed,
            exports_changed,
        };
        Ok((new, changed))
    }

    /// Resolves a path a client named to its export: the export's base, the path
    /// within it, and the name a pull of the whole export gets. `write`: the session
    /// writes there; `read_only`: the whole server is.
    pub(crate) fn resolve<'s, 'p>(
        &'s self,
        read_only: bool,
        grant: &Grant,
        path: &'p [u8],
        write: bool,
    ) -> Result<(&'s ExportSpec, Base, &'p [u8], Vec<u8>)> {
        let (export, rest) = match self.exports.as_slice() {
            [only] if only.spec.name.is_empty() => (only, path),
            all => {
                let trimmed = path.strip_prefix(b"./").unwrap_or(path);
                let (first, rest) = match trimmed.iter().position(|&b| b == b'/') {
                    Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
                    None => (trimmed, &b""[..]),
                };
                let names: Vec<&str> = all
                    .iter()
                    .filter(|e| grant.exports.contains_key(&e.spec.name))
                    .map(|e| e.spec.name.as_str())
                    .collect();
                let found = all.iter().find(|e| {
                    e.spec.name.as_bytes() == first && grant.exports.contains_key(&e.spec.name)
                });
                match found {
                    Some(e) => (e, rest),
                    None => {
                        return Err(Error::refused(
                            ErrorCode::NotFound,
                            format!(
                                "{:?}: paths start with an export's name; yours: {}",
                                String::from_utf8_lossy(path),
                                names.join(", ")
                            ),
                        ));
                    }
                }
            }
        };
        let rights = grant.exports.get(&export.spec.name).copied();
        if rights.is_none() {
            return Err(Error::refused(
                ErrorCode::PermissionDenied,
                format!("user {:?} has no access to this export", grant.user),
            ));
        }
        if write && (read_only || export.spec.read_only || rights != Some(Rights::ReadWrite)) {
            let what = if export.spec.name.is_empty() {
                "this server".to_string()
            } else {
                format!("export {:?}", export.spec.name)
            };
            return Err(Error::refused(
                ErrorCode::ReadOnly,
                format!("{what} is read-only for user {:?}", grant.user),
            ));
        }
        Ok((
            &export.spec,
            Base::Export(export.root.clone()),
            rest,
            export.root_name.clone(),
        ))
    }

    /// Read-write rights to every export (a server without authentication).
    pub(crate) fn all_exports(&self) -> BTreeMap<String, Rights> {
        self.exports
            .iter()
            .map(|e| (e.spec.name.clone(), Rights::ReadWrite))
            .collect()
    }
}

/// What a reload changed ([`Server::reload`](crate::server::Server::reload)), by name; its `Display` is the log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Users that are new.
    pub users_added: Vec<String>,
    /// Users that are gone.
    pub users_removed: Vec<String>,
    /// Users whose credentials or rights changed.
    pub users_changed: Vec<String>,
    /// Exports that are new.
    pub exports_added: Vec<String>,
    /// Exports that are gone.
    pub exports_removed: Vec<String>,
    /// Exports whose directory or read-only flag changed.
    pub exports_changed: Vec<String>,
}

impl Reloaded {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        *self == Reloaded::default()
    }
}

impl std::fmt::Display for Reloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("users and exports unchanged");
        }
        let mut first = true;
        for (what, names) in [
            ("users added", &self.users_added),
            ("users removed", &self.users_removed),
            ("users changed", &self.users_changed),
            ("exports added", &self.exports_added),
            ("exports removed", &self.exports_removed),
            ("exports changed", &self.exports_changed),
        ] {
            if names.is_empty() {
                continue;
            }
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            let shown: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
            write!(f, "{what}: {}", shown.join(", "))?;
        }
        Ok(())
    }
}

/// Names in `new` and not in `old`, in `old` and not in `new`, and in both but
/// different.
fn changes<T: PartialEq>(
    old: &BTreeMap<String, T>,
    new: &BTreeMap<String, T>,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let added = new.keys().filter(|n| !old.contains_key(*n)).cloned();
    let removed = old.keys().filter(|n| !new.contains_key(*n)).cloned();
    let changed = new
        .iter()
        .filter(|(n, v)| old.get(*n).is_some_and(|w| w != *v))
        .map(|(n, _)| n.clone());
    (added.collect(), removed.collect(), changed.collect())
}

/// What a running session uses: a path, written or read, resolved to this export.
pub(crate) struct Use {
    pub(crate) path: Vec<u8>,
    pub(crate) write: bool,
    pub(crate) export: ExportSpec,
}

/// How the error a session ends with when a reload takes away what it runs on starts.
const REVOKED: &str = "credential revoked by the server's configuration reload";

/// The error a session ends with when a reload takes away what it runs on.
fn revoked(why: &str) -> Error {
    Error::refused(ErrorCode::Auth, format!("{REVOKED}: {why}"))
}

/// Whether `e` is the error of a session a reload ended ([`watch`]).
pub(crate) fn is_revoked(e: &Error) -> bool {
    matches!(e, Error::Refused { code: ErrorCode::Auth, message } if message.starts_with(REVOKED))
}

/// Why the policy `p` no longer allows a session that runs as `grant` on `uses`, if it
/// does not.
fn disallowed(p: &Policy, read_only: bool, grant: &Grant, uses: &[Use]) -> Option<String> {
    let grant = match &p.users {
        Some(users) => match grant.recheck(users) {
            Ok(g) => g,
            Err(why) => return Some(why),
        },
        None => Grant {
            exports: p.all_exports(),
            ..grant.clone()
        },
    };
    for u in uses {
        match p.resolve(read_only, &grant, &u.path, u.write) {
            Err(e) => return Some(e.to_string()),
            Ok((e, ..)) if e.path != u.export.path => {
                return Some(format!("export {:?} now serves another directory", e.name));
            }
            Ok(_) => {}
        }
    }
    None
}

/// Ends its task when dropped.
pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Ends `run` with "credential revoked" as soon as the policy in force (`rx`), now or
/// after a reload, no longer allows a session running as `grant` on `uses`
/// (`read_only`: the whole server is); until the guard is dropped. Nothing per chunk:
/// one check now and one per reload.
pub(crate) fn watch(
    mut rx: watch::Receiver<Arc<Policy>>,
    read_only: bool,
    run: Arc<Run>,
    grant: Grant,
    uses: Vec<Use>,
) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        loop {
            let policy = rx.borrow_and_update().clone();
            if let Some(why) = disallowed(&policy, read_only, &grant, &uses) {
                tracing::info!("ending a session of user {:?}: {why}", grant.user);
                run.fail(revoked(&why));
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = run.cancelled() => return,
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Proven, User};
    use crate::server::{Server, ServerConfig};
    use dmover_proto::auth;
    use std::time::Duration;

    fn user(name: &str, token: &[u8], rights: &[(&str, Rights)]) -> User {
        User {
            name: name.into(),
            token: Some(auth::token_keys(token).verifier),
            keys: Vec::new(),
            exports: rights.iter().map(|(e, r)| (e.to_string(), *r)).collect(),
            bwlimit: None,
            metrics_only: false,
        }
    }

    #[test]
    fn a_read_only_export_inside_a_writable_one_is_named() {
        let p = std::path::PathBuf::from;
        let (data, public, other, dataset) = (
            spec("data", &p("/d"), false),
            spec("public", &p("/d/pub"), true),
            spec("other", &p("/dx"), true),
            spec("dataset", &p("/d/pub/set"), false),
        );
        let all = [
            (&data, p("/d")),
            (&public, p("/d/pub")),
            (&other, p("/dx")),
            (&dataset, p("/d/pub/set")),
        ];
        let names: Vec<_> = read_only_within_writable(&all)
            .iter()
            .map(|(o, i)| (o.name.as_str(), i.name.as_str()))
            .collect();
        // `/dx` is beside `/d`, not in it; a writable export inside a read-only one
        // is not a way around the read-only one.
        assert_eq!(names, [("data", "public")]);
    }

    fn spec(name: &str, path: &std::path::Path, read_only: bool) -> ExportSpec {
        ExportSpec {
            name: name.into(),
            path: path.into(),
            read_only,
            third_party: false,
            bwlimit: None,
            preserve_owner: false,
            xattrs_all: false,
        }
    }

    #[tokio::test]
    async fn a_reload_keeps_allowed_sessions_and_names_what_it_takes_away() {
        let dir = tempfile::tempdir().unwrap();
        let (d1, d2) = (dir.path().join("d1"), dir.path().join("d2"));
        std::fs::create_dir_all(&d1).unwrap();
        std::fs::create_dir_all(&d2).unwrap();
        let alice = user("alice", b"a", &[("data", Rights::ReadWrite)]);
        let mut cfg = ServerConfig::new("");
        cfg.exports = vec![spec("data", &d1, false)];
        cfg.users = Some(BTreeMap::from([("alice".to_string(), alice.clone())]));
        let server = Server::new(cfg).unwrap();
        let grant = Grant {
            user: "alice".into(),
            login: "alice".into(),
            proven: Proven::Token(alice.token.clone().unwrap()),
            exports: alice.exports.clone(),
            scope: None,
        };
        let uses = |write| {
            vec![Use {
                path: b"data/x".to_vec(),
                write,
                export: spec("data", &d1, false),
            }]
        };
        let check = |write| disallowed(&server.policy.borrow(), false, &grant, &uses(write));
        assert_eq!(check(true), None);

        let reload = |users: Vec<User>, exports: Vec<ExportSpec>| {
            let users = users.into_iter().map(|u| (u.name.clone(), u)).collect();
            server.reload(exports, Some(users)).unwrap()
        };
        // Bob added, alice unchanged: nothing taken away.
        let bob = user("bob", b"b", &[("data", Rights::ReadOnly)]);
        let r = reload(
            vec![alice.clone(), bob.clone()],
            vec![spec("data", &d1, false)],
        );
        assert_eq!(r.to_string(), "users added: \"bob\"");
        assert_eq!(check(true), None);
        // Alice may only read: her push ends, a pull goes on.
        let ro = user("alice", b"a", &[("data", Rights::ReadOnly)]);
        let r = reload(
            vec![ro.clone(), bob.clone()],
            vec![spec("data", &d1, false)],
        );
        assert_eq!(r.users_changed, ["alice"]);
        assert!(
            check(true).unwrap().contains("read-only"),
            "{:?}",
            check(true)
        );
        assert_eq!(check(false), None);
        // The export moves: every session on it ends.
        let r = reload(vec![alice.clone()], vec![spec("data", &d2, false)]);
        assert_eq!(r.exports_changed, ["data"]);
        assert_eq!(r.users_removed, ["bob"]);
        assert!(check(false).unwrap().contains("another directory"));
        // A new token: sessions that proved the old one end.
        reload(
            vec![user("alice", b"new", &[("data", Rights::ReadWrite)])],
            vec![spec("data", &d1, false)],
        );
        assert!(
            check(false).unwrap().contains("token"),
            "{:?}",
            check(false)
        );
        // Gone.
        reload(vec![bob], vec![spec("data", &d1, false)]);
        assert!(check(false).unwrap().contains("removed"));
        // An export that cannot be opened, or turning authentication off: refused,
        // the policy stays.
        let before = server.policy.borrow().users.clone();
        assert!(
            server
                .reload(
                    vec![spec("data", &dir.path().join("none"), false)],
                    before.clone()
                )
                .is_err()
        );
        assert!(server.reload(vec![spec("data", &d1, false)], None).is_err());
        assert_eq!(server.policy.borrow().users, before);
    }

    #[tokio::test]
    async fn a_session_that_loses_its_rights_is_ended_as_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let alice = user("alice", b"a", &[("data", Rights::ReadWrite)]);
        let mut cfg = ServerConfig::new("");
        cfg.exports = vec![spec("data", dir.path(), false)];
        cfg.users = Some(BTreeMap::from([("alice".to_string(), alice.clone())]));
        let server = Server::new(cfg.clone()).unwrap();
        let grant = Grant {
            user: "alice".into(),
            login: "alice".into(),
            proven: Proven::Token(alice.token.clone().unwrap()),
            exports: alice.exports.clone(),
            scope: None,
        };
        let run = Run::new();
        let _watch = watch(
            server.policy.subscribe(),
            false,
            run.clone(),
            grant,
            Vec::new(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!run.is_cancelled());
        server
            .reload(cfg.exports.clone(), Some(BTreeMap::new()))
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), run.cancelled())
            .await
            .expect("the run is ended");
        let e = run.take_error().unwrap();
        assert!(e.to_string().contains("credential revoked"), "{e}");
        assert_eq!(e.code(), ErrorCode::Auth);
    }
}
