//! `dmover cp` and `dmover sync`, resolved ([`crate::resolve::copy`]): the transfer runs
//! through the library API ([`dmover_core::transfer`]) while the progress shows (a bar,
//! or JSON lines) and `-v` lists the files, then the summary; `--dry-run` tells what a
//! copy or a sync would do.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;

use dmover_core::transfer::{DryRunPlan, Event, Watch};

use crate::args::ProgressMode;
use crate::output::{self, Direction, ProgressBar};
use crate::resolve::{Copy, CopyOut};

/// Runs a resolved `dmover cp` or `dmover sync`; `list`: `-v`'s count (1: name each
/// file sent, 2: each file held too).
pub fn run(c: Copy, list: u8) -> anyhow::Result<ExitCode> {
    if c.dry_run {
        return dry_run(c);
    }
    let Copy {
        transfer,
        show,
        sync,
        spool,
        endpoints,
        ..
    } = c;
    let direction = Direction::of(transfer.direction());
    let dialer = transfer.dialer().map(str::to_string);
    let bwlimit = transfer.options().bwlimit;
    let rt = crate::resolve::runtime(transfer.options().streams)?;
    let signals = crate::interrupt::cancel_on_signals(&rt, transfer.canceller())?;
    let journal = transfer.options().journal;
    let ndjson = show.progress == ProgressMode::Ndjson;
    let progress = transfer.progress().clone();
    let show_bar = show.progress == ProgressMode::Bar && !show.quiet && !show.json;
    let terminal = std::io::stderr().is_terminal();
    let bar = (show_bar && terminal).then(|| ProgressBar::start(&rt, progress.clone()));
    // Not on a terminal (a batch job, cron): a status line now and then.
    let status = (show_bar && !terminal).then(|| {
        let every = show.interval.unwrap_or(STATUS_EVERY);
        output::StatusLines::start(&rt, progress.clone(), every)
    });
    let started = Instant::now();
    let sampler = output::Sampler::start(&rt, progress.clone());
    let (mut watch, mut lines) = match ndjson {
        true => (
            Watch::every(show.interval.unwrap_or(NDJSON_EVERY)),
            Some(output::Ndjson::new(started)),
        ),
        false => (Watch::events(), None),
    };
    if list > 0 && !ndjson {
        // The files as they are done, a few times a second.
        watch = Watch::every(LIST_EVERY);
    }
    watch.held = list > 1;
    // `-v`'s lines go to stdout, as rsync's, unless it carries JSON.
    let listing = (list > 0).then(|| output::FileList::new(sync, show.json || ndjson));
    let result = rt.block_on(transfer.run(watch, |e: Event| {
        if let Some(l) = lines.as_mut() {
            l.event(&e);
        }
        if let Some(l) = &listing {
            match &bar {
                Some(b) => b.suspend(|| l.event(&e)),
                None => l.event(&e),
            }
        }
    }));
    let secs = started.elapsed().as_secs_f64();
    let timing = sampler.finish();
    if let Some(bar) = bar {
        bar.finish();
    }
    if let Some(s) = status {
        s.finish();
    }
    // Join the disk threads: an aborted transfer's staging files are gone after this.
    drop(transfer);
    drop(rt);
    // `cp - DST`: stdin's copy goes.
    drop(spool);
    let stopped = result.is_err().then(|| signals.caught()).flatten();
    let code = output::report_with(
        result.map(|f| f.report),
        direction,
        dialer.as_deref(),
        secs,
        timing,
        show.json || ndjson,
        show.quiet,
        &progress,
        bwlimit,
        sync,
        Some(&endpoints),
    );
    match stopped {
        Some(signal) => {
            stopped_by(sync, journal);
            Ok(ExitCode::from(signal.exit_code()))
        }
        None => Ok(code),
    }
}

/// Time between two `--progress ndjson` lines unless `--progress-interval` says.
const NDJSON_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Time between two status lines (`--progress bar`, stderr not a terminal) unless
/// `--progress-interval` says.
const STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs a resolved `dmover cp HOST:PATH -`: the file's bytes to stdout as they come,
/// checked; a summary line on stderr. A failed check fails the run (exit 1) after the
/// bytes went out: the error says so.
pub fn run_out(c: CopyOut) -> anyhow::Result<ExitCode> {
    let rt = c.client.runtime()?;
    let client = c.client.client();
    let run = dmover_core::engine::Run::new();
    let started = Instant::now();
    let result = rt.block_on(client.pull_to_writer(
        &c.server,
        &c.source,
        Box::new(std::io::stdout()),
        run.clone(),
    ));
    let secs = started.elapsed().as_secs_f64();
    drop(client);
    drop(rt);
    match result {
        Ok(s) => {
            if !c.quiet {
                eprintln!(
                    "wrote {} to stdout in {secs:.2} s{}",
                    output::human_bytes(s.bytes),
                    if s.verified {
                        " (checksums verified)"
                    } else {
                        " (not verified: --no-checksum)"
                    }
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let written = run
                .progress
                .bytes
                .load(std::sync::atomic::Ordering::Relaxed);
            eprintln!("dmover: error: {}", output::printable(&e.to_string()));
            if written > 0 {
                eprintln!(
                    "dmover: {} had already been written to stdout: discard the output",
                    output::human_bytes(written)
                );
            }
            Ok(ExitCode::from(output::exit_code(&e)))
        }
    }
}

/// How often `-v` lists the files done meanwhile.
const LIST_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// After a transfer a signal stopped: what is left and how to go on.
fn stopped_by(sync: bool, journal: bool) {
    let next = match (journal, sync) {
        (false, _) => "it kept no journal (--no-journal): a rerun starts over",
        (true, false) => {
            "the destination keeps its journal: rerun with --resume to go on from there"
        }
        (true, true) => {
            "the destination keeps its journal: run the same sync again to go on from there"
        }
    };
    eprintln!("dmover: stopped cleanly, nothing incomplete under a final name; {next}");
}

/// `dmover sync --dry-run`: what would be sent, skipped and deleted (docs/sync.md);
/// `dmover cp --dry-run`: what would be sent.
fn dry_run(c: Copy) -> anyhow::Result<ExitCode> {
    let direction = Direction::of(c.transfer.direction());
    let rt = crate::resolve::runtime(c.transfer.options().streams)?;
    let result = rt.block_on(c.transfer.dry_run());
    drop(c.transfer);
    drop(rt);
    let plan = match result {
        Ok(p) => p,
        Err(e) => {
            eprintln!("dmover: error: {e}");
            return Ok(ExitCode::from(output::exit_code(&e)));
        }
    };
    let (deleted, deleted_bytes, over) = plan
        .delete
        .as_ref()
        .map_or((0, 0, 0), |d| (d.entries, d.bytes, d.over_limit));
    let delete = plan.delete.is_some();
    if c.show.json {
        print_dry_run_json(&plan, direction);
    } else {
        if !c.show.quiet {
            print_dry_run_lines(&plan);
        }
        eprintln!(
            "dry run: would send {} files ({} bytes){}{}; nothing was changed",
            plan.files_to_send,
            plan.bytes_to_send,
            if c.sync {
                format!(
                    ", skip {} unchanged ({} bytes)",
                    plan.files_unchanged, plan.bytes_unchanged
                )
            } else {
                String::new()
            },
            if delete {
                format!(", delete {deleted} entries ({deleted_bytes} bytes)")
            } else {
                String::new()
            }
        );
    }
    if delete && plan.skipped > 0 {
        eprintln!(
            "dmover: error: the source walk skipped {} entries: a real run would delete nothing",
            plan.skipped
        );
        return Ok(ExitCode::from(1));
    }
    if over > 0 {
        eprintln!(
            "dmover: error: --max-delete would stop deletions: {over} more entries would not \
             be deleted"
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The files a dry run would send, then those it would delete, one a line on stdout.
fn print_dry_run_lines(plan: &DryRunPlan) {
    for rel in &plan.send {
        println!("send {}", output::printable(rel));
    }
    for p in plan.delete.iter().flat_map(|d| &d.paths) {
        println!("delete {}", output::printable(p));
    }
}

/// A dry run's JSON object on stdout (docs/json.md).
fn print_dry_run_json(plan: &DryRunPlan, direction: Direction) {
    let d = plan.delete.as_ref();
    let j = serde_json::json!({
        "schema": output::SCHEMA,
        "type": "dry_run",
        "ok": d.is_none_or(|d| d.over_limit == 0),
        "direction": direction,
        "files_to_send": plan.files_to_send,
        "bytes_to_send": plan.bytes_to_send,
        "files_unchanged": plan.files_unchanged,
        "bytes_unchanged": plan.bytes_unchanged,
        "files_deleted": d.map(|d| d.entries),
        "bytes_deleted": d.map(|d| d.bytes),
        "delete_over_limit": d.map(|d| d.over_limit),
        "skipped": plan.skipped,
    });
    println!("{j}");
}
