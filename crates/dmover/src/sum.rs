//! `dmover sum`: the checksums file catalogs use (adler32, md5, crc32c) of local files,
//! answered from the file's cache (the reserved xattr `user.dmover.sum`) while it is
//! valid, else computed and stored there (docs/checksums.md).

use std::fs::File;
use std::path::PathBuf;
use std::process::ExitCode;

use dmover_store::catalog::{CacheUse, ChecksumType, SumReport, sum_file};

use crate::args::usage;

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
    /// Regular files (a symlink is followed).
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<PathBuf>,
}

fn parse_type(s: &str) -> Result<ChecksumType, String> {
    s.parse()
}

/// One file's line of `--json`.
fn json_of(path: &std::path::Path, r: &SumReport) -> serde_json::Value {
    let mut sums = serde_json::Map::new();
    for s in &r.sums {
        sums.insert(s.kind().name().into(), s.to_string().into());
    }
    serde_json::json!({
        "path": path.to_string_lossy(),
        "size": r.size,
        "checksums": sums,
        "cached": r.cached,
        "stored": r.stored,
    })
}

/// `dmover sum`: exit 0, or 1 when a file could not be summed (the others are).
pub fn run(a: SumArgs) -> anyhow::Result<ExitCode> {
    let mut types = a.types.clone();
    types.dedup();
    if let Some(p) = a
        .paths
        .iter()
        .find(|p| p.to_string_lossy().starts_with("dmover://"))
    {
        return Err(usage(format!(
            "{}: checksums of a server's files are not available yet (docs/checksums.md)",
            p.display()
        )));
    }
    let cache = if a.no_cache {
        CacheUse::OFF
    } else {
        CacheUse::ON
    };
    let mut files = Vec::new();
    let mut failed = false;
    for p in &a.paths {
        let r = File::open(p).and_then(|f| sum_file(&f, &types, cache));
        match r {
            Ok(r) if a.json => files.push(json_of(p, &r)),
            Ok(r) => {
                let values: Vec<String> = if types.len() == 1 {
                    vec![r.sums[0].to_string()]
                } else {
                    r.sums.iter().map(|s| format!("{}:{s}", s.kind())).collect()
                };
                println!(
                    "{}  {}",
                    values.join("  "),
                    crate::output::printable(&p.to_string_lossy())
                );
            }
            Err(e) => {
                failed = true;
                eprintln!(
                    "dmover: error: {}: {e}",
                    crate::output::printable(&p.to_string_lossy())
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
