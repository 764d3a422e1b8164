//! From a [`TransferSpec`] to what runs: which way the data goes (a push, a pull, a
//! copy between two servers directly or through this side) and the options of that
//! run, or a [`PlanError`] saying why the description makes no sense. Pure: no file,
//! socket or thread is touched here.

use dmover_proto::control::TpcMode;

use super::{Between, Endpoint, Kind, TransferSpec};
use crate::client::ThirdPartyCopy;
use crate::session::TransferOptions;

/// Why a [`TransferSpec`] cannot run. The CLI says these in terms of its flags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// No source was named.
    #[error("a transfer needs at least one source")]
    NoSource,
    /// A sync takes exactly one source (the tree its destination mirrors).
    #[error("a sync takes one source and the destination")]
    SyncSources,
    /// `delete`, `max_delete`, `compare_content` or `quick_check` on a copy.
    #[error("deleting and comparing with the destination are options of a sync")]
    SyncOnly,
    /// `compare_content` with a `quick_check` other than size and mtime.
    #[error("comparing content and keeping files by size or existence exclude each other")]
    ContentAndQuickCheck,
    /// A `quick_check` other than size and mtime on a sync between two servers.
    #[error(
        "keeping files by size or existence is not supported on a sync between two \
         servers yet"
    )]
    QuickCheckBetweenServers,
    /// `max_delete` without `delete`.
    #[error("a limit of deletions needs deleting on")]
    MaxDeleteWithoutDelete,
    /// `delete` with a `files_from` list.
    #[error(
        "deleting with a list of files is not supported yet (which destination entries \
         the list protects is not defined)"
    )]
    DeleteWithFilesFrom,
    /// A sync between two servers relayed through this side.
    #[error(
        "a sync between two servers goes directly from one to the other (not through the client) yet"
    )]
    SyncViaClient,
    /// A sync's destination that names no directory of its own.
    #[error("sync: DST must name the mirror directory itself (not '.', '..' or a server's root)")]
    MirrorName,
    /// A bandwidth limit on a copy between two servers.
    #[error(
        "a bandwidth limit does not apply to a copy between two servers (the data does \
         not pass through this client; the servers' own limits apply)"
    )]
    BwlimitBetweenServers,
    /// Sources on more than one server.
    #[error("all sources must be on the same server")]
    MixedServers,
    /// A local source among the sources of a copy between two servers.
    #[error("{0}: a copy between two servers takes sources on one server only")]
    LocalSourceBetweenServers(String),
    /// A local source among remote ones, with a local destination.
    #[error("{0} is local and the other sources are on a server: copy them in two runs")]
    MixedLocal(String),
    /// [`TransferSpec::between_servers`] set on a transfer that is not between two
    /// servers.
    #[error("a third-party mode is for copies between two servers")]
    NotBetweenServers,
}

/// Which way the data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Local to a server.
    Push,
    /// A server to local.
    Pull,
    /// Server to server, the source server dialing the destination.
    ThirdPartyPush,
    /// Server to server, the destination server dialing the source.
    ThirdPartyPull,
    /// Server to server through this side (a pull and a push at once).
    Relay,
    /// Local paths to a local path, through the same session, both halves in this
    /// process.
    Local,
}

/// What runs: the client call and its arguments.
#[derive(Debug, Clone)]
pub(super) enum Route {
    Push {
        server: String,
        sources: Vec<Vec<u8>>,
        dest: Vec<u8>,
    },
    Pull {
        server: String,
        sources: Vec<Vec<u8>>,
        dest: Vec<u8>,
    },
    ThirdParty(ThirdPartyCopy),
    Relay {
        copy: ThirdPartyCopy,
        ring: usize,
    },
    Local {
        sources: Vec<Vec<u8>>,
        dest: Vec<u8>,
    },
}

impl Route {
    pub(super) fn direction(&self) -> Direction {
        match self {
            Route::Push { .. } => Direction::Push,
            Route::Pull { .. } => Direction::Pull,
            Route::ThirdParty(c) if c.mode == TpcMode::Push => Direction::ThirdPartyPush,
            Route::ThirdParty(_) => Direction::ThirdPartyPull,
            Route::Relay { .. } => Direction::Relay,
            Route::Local { .. } => Direction::Local,
        }
    }
}

/// Checks `spec` and decides its route; the options are those of the run (a sync's
/// `mirror` and `resume` set).
pub(super) fn plan(spec: TransferSpec) -> Result<(Route, TransferOptions), PlanError> {
    let TransferSpec {
        sources,
        dest,
        kind,
        between_servers,
        mut options,
        ..
    } = spec;
    check_options(&sources, kind, &options)?;
    let sync = kind == Kind::Sync;
    options.mirror = sync;
    if sync {
        // The destination's files are looked at (size, mtime) as a resume does.
        options.resume = true;
    }
    let remote_source = sources.iter().any(Endpoint::is_remote);
    if sync {
        let relayed = matches!(between_servers, Some(Between::ViaClient { .. }));
        if relayed && dest.is_remote() && sources[0].is_remote() {
            return Err(PlanError::SyncViaClient);
        }
        check_mirror_name(dest.path())?;
    }
    let route = match dest {
        Endpoint::Remote { server, path } if remote_source => {
            if options.bwlimit.is_some() {
                return Err(PlanError::BwlimitBetweenServers);
            }
            if options.quick_check != dmover_store::prune::QuickCheck::SizeAndMtime {
                return Err(PlanError::QuickCheckBetweenServers);
            }
            between(sources, server, path, between_servers.unwrap_or_default())?
        }
        _ if between_servers.is_some() => return Err(PlanError::NotBetweenServers),
        Endpoint::Remote { server, path } => Route::Push {
            server,
            sources: sources.into_iter().map(|s| s.path().to_vec()).collect(),
            dest: path,
        },
        Endpoint::Local(dest) if !remote_source => Route::Local {
            sources: sources.into_iter().map(|s| s.path().to_vec()).collect(),
            dest,
        },
        Endpoint::Local(dest) => {
            let (server, sources) = one_server(sources, PlanError::MixedLocal)?;
            Route::Pull {
                server,
                sources,
                dest,
            }
        }
    };
    Ok((route, options))
}

/// The checks of the options alone.
fn check_options(sources: &[Endpoint], kind: Kind, o: &TransferOptions) -> Result<(), PlanError> {
    if sources.is_empty() {
        return Err(PlanError::NoSource);
    }
    if kind == Kind::Sync && sources.len() != 1 {
        return Err(PlanError::SyncSources);
    }
    let quick = o.quick_check != dmover_store::prune::QuickCheck::SizeAndMtime;
    if kind == Kind::Copy && (o.delete || o.max_delete.is_some() || o.compare_content || quick) {
        return Err(PlanError::SyncOnly);
    }
    if o.compare_content && quick {
        return Err(PlanError::ContentAndQuickCheck);
    }
    if o.max_delete.is_some() && !o.delete {
        return Err(PlanError::MaxDeleteWithoutDelete);
    }
    if o.delete && o.files_from.is_some() {
        return Err(PlanError::DeleteWithFilesFrom);
    }
    Ok(())
}

/// A mirror's destination names its own directory: not `.`, `..` or a server's root.
fn check_mirror_name(dest: &[u8]) -> Result<(), PlanError> {
    let name = dest
        .split(|&b| b == b'/')
        .rfind(|c| !c.is_empty())
        .unwrap_or_default();
    if name.is_empty() || name == b"." || name == b".." {
        return Err(PlanError::MirrorName);
    }
    Ok(())
}

/// The one server of `sources` and their paths on it; a local source is `local`'s
/// error.
fn one_server(
    sources: Vec<Endpoint>,
    local: fn(String) -> PlanError,
) -> Result<(String, Vec<Vec<u8>>), PlanError> {
    let mut server: Option<String> = None;
    let mut paths = Vec::new();
    for s in sources {
        match s {
            Endpoint::Remote { server: h, path } => {
                if server.as_ref().is_some_and(|s| *s != h) {
                    return Err(PlanError::MixedServers);
                }
                server = Some(h);
                paths.push(path);
            }
            Endpoint::Local(p) => return Err(local(String::from_utf8_lossy(&p).into_owned())),
        }
    }
    // `check_options` saw a source, and a local one returned above.
    server.map(|s| (s, paths)).ok_or(PlanError::NoSource)
}

/// The route of a copy from `sources` (on one server) to `dest` on `dest_server`.
fn between(
    sources: Vec<Endpoint>,
    dest_server: String,
    dest: Vec<u8>,
    how: Between,
) -> Result<Route, PlanError> {
    let (source_server, sources) = one_server(sources, PlanError::LocalSourceBetweenServers)?;
    let copy = |mode| ThirdPartyCopy {
        mode,
        source_server,
        sources,
        dest_server,
        dest,
    };
    Ok(match how {
        Between::Direct(mode) => Route::ThirdParty(copy(mode)),
        // The mode is not used by a relay; its sessions are a pull and a push.
        Between::ViaClient { ring_bytes } => Route::Relay {
            copy: copy(TpcMode::Push),
            ring: ring_bytes,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Endpoint {
        Endpoint::parse(s).unwrap()
    }

    fn spec(sources: &[&str], dest: &str) -> TransferSpec {
        TransferSpec::copy(sources.iter().map(|s| r(s)).collect(), r(dest))
    }

    #[test]
    fn routes() {
        let (route, _) = plan(spec(&["a", "b"], "h:d")).unwrap();
        assert_eq!(route.direction(), Direction::Push);
        let (route, _) = plan(spec(&["h:a", "h:b"], "d")).unwrap();
        assert_eq!(route.direction(), Direction::Pull);
        let (route, _) = plan(spec(&["a", "b"], "d")).unwrap();
        assert_eq!(route.direction(), Direction::Local);
        let (_, o) = plan(TransferSpec::sync(r("a"), r("m"))).unwrap();
        assert!(o.mirror && o.resume);
        let (route, _) = plan(spec(&["h:a"], "g:d")).unwrap();
        assert_eq!(route.direction(), Direction::ThirdPartyPush);
        let mut s = spec(&["h:a"], "g:d");
        s.between_servers = Some(Between::Direct(TpcMode::Pull));
        assert_eq!(plan(s).unwrap().0.direction(), Direction::ThirdPartyPull);
        let mut s = spec(&["h:a"], "g:d");
        s.between_servers = Some(Between::via_client());
        assert_eq!(plan(s).unwrap().0.direction(), Direction::Relay);
        let (_, o) = plan(TransferSpec::sync(r("a"), r("h:m"))).unwrap();
        assert!(o.mirror && o.resume);
        let (_, o) = plan(spec(&["a"], "h:d")).unwrap();
        assert!(!o.mirror && !o.resume);
        // Between two servers: a sync, and a copy with filters.
        let (route, o) = plan(TransferSpec::sync(r("h:a"), r("k:m"))).unwrap();
        assert_eq!(route.direction(), Direction::ThirdPartyPush);
        assert!(o.mirror && o.resume);
        let mut s = spec(&["h:a"], "k:d");
        s.options.rules = vec![dmover_proto::control::FilterRule {
            include: false,
            pattern: b"x".to_vec(),
        }];
        assert_eq!(plan(s).unwrap().0.direction(), Direction::ThirdPartyPush);
    }

    #[test]
    fn refusals() {
        let e = |s: TransferSpec| plan(s).unwrap_err();
        assert_eq!(e(spec(&[], "h:d")), PlanError::NoSource);
        assert_eq!(
            e(spec(&["h:a", "b"], "d")),
            PlanError::MixedLocal("b".into())
        );
        assert_eq!(e(spec(&["h:a", "g:b"], "d")), PlanError::MixedServers);
        assert_eq!(e(spec(&["h:a", "g:b"], "k:d")), PlanError::MixedServers);
        assert_eq!(
            e(spec(&["h:a", "b"], "k:d")),
            PlanError::LocalSourceBetweenServers("b".into())
        );
        let mut s = spec(&["a"], "h:d");
        s.between_servers = Some(Between::via_client());
        assert_eq!(e(s), PlanError::NotBetweenServers);
        let mut s = spec(&["h:a"], "k:d");
        s.options.bwlimit = Some(1);
        assert_eq!(e(s), PlanError::BwlimitBetweenServers);
        let mut s = spec(&["a"], "h:d");
        s.options.delete = true;
        assert_eq!(e(s), PlanError::SyncOnly);
        let mut s = TransferSpec::sync(r("a"), r("h:m"));
        s.options.max_delete = Some(1);
        assert_eq!(e(s), PlanError::MaxDeleteWithoutDelete);
        let mut s = TransferSpec::sync(r("a"), r("h:m"));
        (s.options.delete, s.options.files_from) = (true, Some(b"x\n".to_vec()));
        assert_eq!(e(s), PlanError::DeleteWithFilesFrom);
        let mut s = TransferSpec::sync(r("h:a"), r("k:m"));
        s.between_servers = Some(Between::via_client());
        assert_eq!(e(s), PlanError::SyncViaClient);
        use dmover_store::prune::QuickCheck;
        let mut s = spec(&["a"], "h:d");
        s.options.quick_check = QuickCheck::Exists;
        assert_eq!(e(s), PlanError::SyncOnly);
        let mut s = TransferSpec::sync(r("a"), r("h:m"));
        (s.options.quick_check, s.options.compare_content) = (QuickCheck::Size, true);
        assert_eq!(e(s), PlanError::ContentAndQuickCheck);
        let mut s = TransferSpec::sync(r("h:a"), r("k:m"));
        s.options.quick_check = QuickCheck::Size;
        assert_eq!(e(s), PlanError::QuickCheckBetweenServers);
        for q in [QuickCheck::Size, QuickCheck::Exists] {
            let mut s = TransferSpec::sync(r("h:a"), r("m"));
            s.options.quick_check = q;
            assert!(plan(s).is_ok(), "{q:?} on a pull");
        }
        for dest in ["h:", "h:.", "h:a/..", "h:/", "."] {
            assert_eq!(
                e(TransferSpec::sync(r("a"), r(dest))),
                PlanError::MirrorName,
                "{dest}"
            );
        }
    }
}
