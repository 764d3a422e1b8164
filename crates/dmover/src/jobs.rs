//! `dmover submit`, `jobs`, `job`, `cancel`, `retry`: clients of a job service's REST
//! API (docs/jobs.md), through [`dmover_jobs::client`].

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use dmover_jobs::client::ApiClient;
use dmover_jobs::model::{FilterRule, Job, JobId, JobOptions, JobSpec, Route, SyncOptions};

use crate::args::{TpcArg, usage};
use crate::env::Env;
use crate::resolve::profile::Profiles;

/// How to reach the job service: shared by the job commands.
#[derive(Debug, Clone, Args)]
pub struct ServiceArgs {
    /// The job service: http://HOST:PORT (loopback) or https://HOST:PORT [default:
    /// the client config's `service`, docs/client.md].
    #[arg(long, env = "DMOVER_SERVICE", value_name = "URL")]
    pub service: Option<String>,
    /// File holding your token on the service's server [default: DMOVER_TOKEN, else
    /// the token file of the client config's profile of the service's host, else of
    /// its `[defaults]`].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Known-hosts file where an https:// service's key is pinned [default: the
    /// client's known-hosts file].
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `dmover submit`.
#[derive(Debug, Clone, Args)]
pub struct SubmitArgs {
    /// Sources on one server, then the destination on a server: dmover://HOST[:PORT]/PATH
    /// or HOST:PATH. A destination ending in / is a directory that receives the sources.
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<OsString>,
    /// Parallel data streams.
    #[arg(short = 'P', long, value_parser = clap::value_parser!(u16).range(1..=128))]
    pub streams: Option<u16>,
    /// Leave files that cannot be copied and go on with the rest (their errors are kept
    /// by file; the job ends failed).
    #[arg(long)]
    pub continue_on_error: bool,
    /// Read every file back at the destination and compare digests.
    #[arg(long)]
    pub verify: bool,
    /// Which server dials the other.
    #[arg(long, value_enum, value_name = "MODE")]
    pub tpc: Option<TpcArg>,
    /// Relay the data through the job service (servers that cannot reach each other).
    #[arg(long, conflicts_with = "tpc")]
    pub via_client: bool,
    /// A sync, as `dmover sync`: one source, DST is its mirror; only what changed is
    /// sent (docs/sync.md).
    #[arg(long)]
    pub sync: bool,
    /// (--sync) Delete what the mirror holds that the source does not (entries the
    /// filters exclude are kept).
    #[arg(long, requires = "sync")]
    pub delete: bool,
    /// (--sync --delete) Delete at most N entries.
    #[arg(long, value_name = "N", requires = "delete")]
    pub max_delete: Option<u64>,
    /// (--sync) Compare files of equal size by content, not by mtime.
    #[arg(short = 'c', long, requires = "sync")]
    pub checksum: bool,
    #[command(flatten)]
    pub filters: crate::args::FilterArgs,
    /// Its order among your own queued jobs, 1 (last) to 5 (first) [default: 3].
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub priority: Option<u8>,
    /// A webhook: POST the job's record (JSON) to URL each time it ends (the URL must
    /// be under one of the service's `[jobs] webhooks`; docs/jobs.md).
    #[arg(long, value_name = "URL")]
    pub notify: Option<String>,
    /// (--sync) Run the sync again this long after each run started (a duration with
    /// a unit: 15m, 1h, 1d; at least 1m); `dmover cancel` ends it.
    #[arg(long, requires = "sync", value_name = "D", value_parser = parse_every)]
    pub every: Option<u64>,
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// `dmover jobs`.
#[derive(Debug, Clone, Args)]
pub struct JobsArgs {
    /// Jobs per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// The page after this job id (the previous page's `next`).
    #[arg(long, value_name = "ID")]
    pub before: Option<JobId>,
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// `dmover job`.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// The job's id.
    pub id: JobId,
    /// Follow the job until it ends: a line at each change (with --json, the job as
    /// NDJSON), then the job; exit 0 if it is done, 1 if it failed or was cancelled.
    #[arg(long, short = 'f')]
    pub follow: bool,
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// `dmover cancel`, `retry`.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// The job's id.
    pub id: JobId,
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// What a job command does with its job.
#[derive(Debug, Clone, Copy)]
pub enum Act {
    /// Cancel it.
    Cancel,
    /// Queue it again.
    Retry,
}

fn client(a: &ServiceArgs, env: &Env) -> anyhow::Result<ApiClient> {
    let profiles = crate::resolve::profile::loaded(env)?;
    let defaults = profiles.map(|p| &p.file.defaults);
    let service = a
        .service
        .clone()
        .or_else(|| defaults.and_then(|d| d.service.clone()))
        .ok_or_else(|| {
            usage(
                "no job service: pass --service URL, set DMOVER_SERVICE, or write service = \
                 \"URL\" under [defaults] in the client config (docs/client.md)",
            )
        })?;
    let mut token = crate::resolve::token(a.token_file.as_deref(), env)?;
    if token.is_none() {
        // The profile of the service's host (by name or address), else [defaults].
        let host = service_host(&service);
        let file = profiles
            .and_then(|p| p.host(host))
            .and_then(|(_, h)| h.token_file.as_deref())
            .or_else(|| defaults.and_then(|d| d.token_file.as_deref()));
        token = crate::resolve::profile::credential(file, None)?.0;
    }
    let token = token.map(|t| String::from_utf8_lossy(&t).trim().to_string());
    let kh = a
        .known_hosts
        .clone()
        .or_else(|| defaults.and_then(|d| d.known_hosts.clone()))
        .or_else(|| env.known_hosts())
        .context("no known-hosts file: pass --known-hosts FILE")?;
    Ok(ApiClient::new(&service, token, kh)?)
}

/// The host of a service URL (`https://HOST:PORT/...`), an IPv6 address without its
/// brackets.
fn service_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime")
}

/// The spec `dmover submit`'s arguments describe; local paths are refused here. A
/// host the client config has a profile for goes to the service as the profile's
/// address and port (`dmover://ADDRESS:PORT/PATH`): the service dials it with its own
/// credential.
fn spec(a: &SubmitArgs, profiles: Option<&Profiles>) -> anyhow::Result<JobSpec> {
    let mut paths = Vec::new();
    for p in &a.paths {
        let s = p
            .to_str()
            .ok_or_else(|| usage(format!("{} is not UTF-8", p.to_string_lossy())))?;
        match dmover_core::transfer::Endpoint::parse(s) {
            Ok(mut e) if e.is_remote() => {
                match profiles.and_then(|pr| pr.route(s.as_bytes(), &mut e, None)) {
                    Some(_) => paths.push(e.to_string()),
                    None => paths.push(s.to_string()),
                }
            }
            Ok(_) => {
                return Err(usage(format!(
                    "{s} is a local path: a job runs on the service, so its sources and \
                     destination are paths on servers (dmover://HOST[:PORT]/PATH or \
                     HOST:PATH); use dmover cp for local files"
                )));
            }
            Err(e) => return Err(usage(format!("{s}: {e}"))),
        }
    }
    let destination = paths.pop().expect("clap requires two paths");
    if a.sync && paths.len() != 1 {
        return Err(usage(
            "submit --sync takes one source and the destination: dmover submit --sync SRC DST",
        ));
    }
    Ok(JobSpec {
        sources: paths,
        destination,
        options: JobOptions {
            streams: a.streams,
            continue_on_error: a.continue_on_error,
            verify: a.verify,
            route: match (a.via_client, a.tpc) {
                (true, _) => Route::ViaService,
                (_, Some(TpcArg::Pull)) => Route::Pull,
                _ => Route::Push,
            },
            sync: a.sync.then_some(SyncOptions {
                delete: a.delete,
                max_delete: a.max_delete,
                checksum: a.checksum,
            }),
            filters: filters(&a.filters)?,
            priority: a.priority,
            notify: a.notify.clone(),
            every_secs: a.every,
        },
    })
}

/// `--every`: a duration of at least a minute, in seconds.
fn parse_every(s: &str) -> Result<u64, String> {
    let d = dmover_proto::units::parse_duration(s)?;
    let min = dmover_jobs::model::MIN_EVERY_SECS;
    if d.as_secs() < min {
        return Err(format!("{s:?} is too often: at least {min}s"));
    }
    Ok(d.as_secs())
}

/// A job's `--include`/`--exclude` rules, in order (`--exclude-from` and
/// `--include-from` files read in their place); `--files-from` is not for jobs yet.
fn filters(f: &crate::args::FilterArgs) -> anyhow::Result<Vec<FilterRule>> {
    if f.files_from.is_some() {
        return Err(usage("--files-from is not supported for jobs yet"));
    }
    crate::resolve::filter_rules(f)?
        .into_iter()
        .map(|(include, p)| {
            let pattern = String::from_utf8(p).map_err(|e| {
                usage(format!(
                    "{} is not UTF-8",
                    String::from_utf8_lossy(e.as_bytes())
                ))
            })?;
            Ok(FilterRule { include, pattern })
        })
        .collect()
}

/// `dmover submit`: prints the new job's id (`--json`: `{"id": N}`).
pub fn submit(a: SubmitArgs, env: &Env) -> anyhow::Result<ExitCode> {
    let spec = spec(&a, crate::resolve::profile::loaded(env)?)?;
    let c = client(&a.service, env)?;
    let job = runtime()?.block_on(c.submit(&spec))?;
    if a.service.json {
        println!("{}", serde_json::json!({ "id": job.id }));
    } else {
        println!("{}", job.id);
    }
    Ok(ExitCode::SUCCESS)
}

/// `dmover jobs`: a page of jobs, newest first.
pub fn list(a: JobsArgs, env: &Env) -> anyhow::Result<ExitCode> {
    let c = client(&a.service, env)?;
    let page = runtime()?.block_on(c.list(a.limit, a.before))?;
    if a.service.json {
        println!("{}", serde_json::to_string(&page)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>6}  {:<9}  {:<10}  {:>11}  {:>15}  SOURCES -> DESTINATION",
        "ID", "STATE", "OWNER", "FILES", "BYTES"
    );
    for j in &page.jobs {
        println!(
            "{:>6}  {:<9}  {:<10}  {:>11}  {:>15}  {} -> {}",
            j.id,
            j.state.as_str(),
            j.owner,
            format!("{}/{}", j.files_done, j.files_total),
            format!("{}/{}", j.bytes, j.bytes_total),
            j.spec.sources.join(" "),
            j.spec.destination
        );
    }
    if let Some(n) = page.next {
        println!("more: dmover jobs --before {n}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `dmover job`, `cancel`, `retry`: the job afterwards.
pub fn act(a: JobArgs, act: Act, env: &Env) -> anyhow::Result<ExitCode> {
    let c = client(&a.service, env)?;
    let rt = runtime()?;
    let job = rt.block_on(async {
        match act {
            Act::Cancel => c.cancel(a.id).await,
            Act::Retry => c.retry(a.id).await,
        }
    })?;
    if a.service.json {
        println!("{}", serde_json::to_string(&job)?);
    } else {
        print!("{}", describe(&job));
    }
    Ok(ExitCode::SUCCESS)
}

/// `dmover job`: the job, or (`--follow`) its changes until it ends.
pub fn show(a: ShowArgs, env: &Env) -> anyhow::Result<ExitCode> {
    let c = client(&a.service, env)?;
    let rt = runtime()?;
    if !a.follow {
        let job = rt.block_on(c.job(a.id))?;
        if a.service.json {
            println!("{}", serde_json::to_string(&job)?);
        } else {
            print!("{}", describe(&job));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let json = a.service.json;
    let job = rt.block_on(c.events(a.id, |j| {
        if json {
            if let Ok(line) = serde_json::to_string(j) {
                println!("{line}");
            }
        } else if !j.state.is_end() {
            println!("{}", one_line(j));
        }
    }))?;
    if !json {
        print!("{}", describe(&job));
    }
    Ok(if job.state == dmover_jobs::model::State::Done {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A job's state and counters in one line.
fn one_line(j: &Job) -> String {
    format!(
        "job {}: {}, {}/{} files, {} of {} bytes, {:.1} MB/s",
        j.id,
        j.state.as_str(),
        j.files_done,
        j.files_total,
        j.bytes,
        j.bytes_total,
        j.rate / 1e6
    )
}

/// A job in lines.
fn describe(j: &Job) -> String {
    let time = |ms: Option<i64>| ms.map_or("-".to_string(), |t| format!("{:.3}", t as f64 / 1e3));
    let mut out = format!(
        "job {}: {}{}\nowner: {}\nsources: {}\ndestination: {}\npriority: {}, link: {}\n\
         files: {} done, {} failed, \
         {} total\nbytes: {} of {} ({} resumed), {:.1} MB/s\nattempts: {}\n\
         submitted: {} s, started: {} s, ended: {} s (Unix time)\n",
        j.id,
        j.state.as_str(),
        if j.cancel_requested {
            " (cancel requested)"
        } else {
            ""
        },
        j.owner,
        j.spec.sources.join(" "),
        j.spec.destination,
        j.priority,
        j.link,
        j.files_done,
        j.files_failed,
        j.files_total,
        j.bytes,
        j.bytes_total,
        j.bytes_resumed,
        j.rate / 1e6,
        j.attempts,
        time(Some(j.created_ms)),
        time(j.started_ms),
        time(j.ended_ms),
    );
    // What servers said, and names from their trees: escaped for the terminal.
    let p = |s: &str| crate::output::printable(s).replace('\n', "\\n");
    if let Some(e) = &j.error {
        out.push_str(&format!("error: {}\n", p(e)));
    }
    for f in &j.file_errors {
        out.push_str(&format!("  {}: {}\n", p(&f.path), p(&f.error)));
    }
    if let Some(every) = j.spec.options.every_secs {
        out.push_str(&format!("every: {every} s"));
        if j.state == dmover_jobs::model::State::Queued {
            out.push_str(&format!(
                ", next run at {} s (Unix time)",
                time(Some(j.not_before_ms))
            ));
        }
        out.push('\n');
    }
    if let Some(url) = &j.spec.options.notify {
        let state = j
            .webhook
            .map_or("not yet (the job has not ended)", |w| w.as_str());
        out.push_str(&format!("webhook: {}: {state}", p(url)));
        if let Some(e) = &j.webhook_error {
            out.push_str(&format!(" ({})", p(e)));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with a profile goes to the service as its address and port; the others
    /// as written.
    #[test]
    fn submit_routes_hosts_by_their_profiles() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "dmover",
            "submit",
            "--service",
            "http://127.0.0.1:7780",
            "alpha:run1",
            "dmover://beta:9/x",
            "other:in/",
        ])
        .unwrap();
        let crate::cli::Command::Submit(a) = cli.command else {
            panic!("not submit");
        };
        let file = toml::from_str(
            "[host.alpha]\naddress = \"10.0.0.1\"\nport = 7701\n[host.beta]\naddress = \"::1\"\n",
        )
        .unwrap();
        let p = Profiles {
            path: "c".into(),
            file,
        };
        let s = spec(&a, Some(&p)).unwrap();
        assert_eq!(
            s.sources,
            ["dmover://10.0.0.1:7701/run1", "dmover://[::1]:9/x"]
        );
        assert_eq!(s.destination, "other:in/");
        let s = spec(&a, None).unwrap();
        assert_eq!(s.sources, ["alpha:run1", "dmover://beta:9/x"]);
    }
}
