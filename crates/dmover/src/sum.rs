//! `dmover sum`: the checksums file catalogs use (adler32, md5, crc32c) of local files
//! and of a server's (`dmover://HOST/PATH`, `HOST:PATH`: the server computes them,
//! [`dmover_proto::control::Op::Sums`]), answered from the file's cache (the reserved
//! xattr `user.dmover.sum`) while it is valid, else computed and stored there
//! (docs/checksums.md).

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use dmover_core::transfer::Endpoint;
use dmover_store::catalog::{CacheUse, ChecksumType, SumReport, sum_file};

use crate::args::TransferArgs;
use crate::env::Env;

/// `dmover sum`.
#[derive(Debug, clap::Args)]
pub struct SumArgs {
    /// The checksum types, as FTS3 and Rucio name them: adler32, md5, crc32c (repeat
    /// the option or separate them with commas).
    #[arg(
        long = "type",
        visible_alias = "checksum-type",
        value_name = "TYPE",
        value_delimiter = ',',
        default_value = "adler32",
        value_parser = parse_type
    )]
    pub types: Vec<ChecksumType>,
    /// Read every file, whatever its cache holds, and leave the cache as it is.
    #[arg(long)]
    pub no_cache: bool,
    /// One JSON object on stdout (docs/json.md): each file's path, size, values, and
    /// whether they came from the cache.
    #[arg(long)]
    pub json: bool,
    /// Regular files: local (a symlink is followed) or on a server,
    /// `dmover://[USER@]HOST[:PORT]/PATH` or `[USER@]HOST:PATH` (a symlink is not
    /// followed there).
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<OsString>,
    #[command(flatten, next_help_heading = "Connection (a server's files)")]
    pub transfer: TransferArgs,
}

fn parse_type(s: &str) -> Result<ChecksumType, String> {
    s.parse()
}

/// One file's line of `--json`.
fn json_of(path: &str, r: &SumReport) -> serde_json::Value {
    let mut sums = serde_json::Map::new();
    for s in &r.sums {
        sums.insert(s.kind().name().into(), s.to_string().into());
    }
    serde_json::json!({
        "path": path,
        "size": r.size,
        "checksums": sums,
        "cached": r.cached,
        "stored": r.stored,
    })
}

/// Where one argument is.
enum Place {
    Local(std::path::PathBuf),
    Remote { server: String, path: Vec<u8> },
}

/// `dmover sum`: exit 0, or 1 when a file could not be summed (the others are).
pub fn run(a: SumArgs, env: &Env) -> anyhow::Result<ExitCode> {
    let types = dmover_store::catalog::unique(&a.types);
    let cache = if a.no_cache {
        CacheUse::OFF
    } else {
        CacheUse::ON
    };
    let mut places = Vec::new();
    let mut users = Vec::new();
    let mut routes = Vec::new();
    for p in &a.paths {
        let (mut endpoint, user) = Endpoint::parse_with_user(p.as_bytes())
            .map_err(|e| crate::args::usage(format!("{}: {e}", p.to_string_lossy())))?;
        if let Endpoint::Remote { .. } = endpoint {
            routes.extend(crate::resolve::route(
                p.as_bytes(),
                &mut endpoint,
                user.as_deref(),
                env,
            )?);
            users.extend(user);
        }
        places.push(match endpoint {
            Endpoint::Local(l) => Place::Local(std::ffi::OsStr::from_bytes(&l).into()),
            Endpoint::Remote { server, path } => Place::Remote { server, path },
        });
    }
    let remote = if places.iter().any(|p| matches!(p, Place::Remote { .. })) {
        let mut setup = crate::resolve::client(&a.transfer, env)?;
        setup.users(&a.transfer, &users, &routes, env)?;
        let rt = setup.runtime()?;
        Some((rt, setup.client()))
    } else {
        None
    };
    let names: Vec<String> = types.iter().map(|t| t.name().to_string()).collect();
    let mut files = Vec::new();
    let mut failed = false;
    for (arg, place) in a.paths.iter().zip(places) {
        let shown = arg.to_string_lossy().into_owned();
        let r: anyhow::Result<SumReport> = match place {
            Place::Local(p) => File::open(&p)
                .and_then(|f| sum_file(&f, &types, cache))
                .map_err(Into::into),
            Place::Remote { server, path } => {
                let (rt, client) = remote.as_ref().expect("a client for remote paths");
                rt.block_on(client.sums_remote(&server, &path, names.clone(), !a.no_cache))
                    .map_err(anyhow::Error::from)
                    .and_then(|r| report_of(&types, r))
            }
        };
        match r {
            Ok(r) if a.json => files.push(json_of(&shown, &r)),
            Ok(r) => {
                let values: Vec<String> = if types.len() == 1 {
                    vec![r.sums[0].to_string()]
                } else {
                    r.sums.iter().map(|s| format!("{}:{s}", s.kind())).collect()
                };
                println!(
                    "{}  {}",
                    values.join("  "),
                    crate::output::printable(&shown)
                );
            }
            Err(e) => {
                failed = true;
                eprintln!(
                    "dmover: error: {}: {}",
                    crate::output::printable(&shown),
                    crate::output::printable(&format!("{e:#}"))
                );
            }
        }
    }
    if a.json {
        println!("{}", serde_json::json!({ "files": files }));
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A server's answer as a local report, checked: one value of each type asked, in
/// their order, each well formed.
fn report_of(
    types: &[ChecksumType],
    r: dmover_proto::control::SumsReport,
) -> anyhow::Result<SumReport> {
    use dmover_store::catalog::Checksum;
    let bad = || anyhow::anyhow!("the server's answer does not give the types asked");
    if r.sums.len() != types.len() {
        return Err(bad());
    }
    let sums = types
        .iter()
        .zip(&r.sums)
        .map(|(t, (name, value))| {
            if name != t.name() {
                return Err(bad());
            }
            Checksum::parse(*t, value).ok_or_else(bad)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(SumReport {
        sums,
        size: r.size,
        cached: r.cached,
        stored: r.stored,
    })
}
