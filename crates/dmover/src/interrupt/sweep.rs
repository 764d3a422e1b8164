//! Ctrl-C (SIGINT), SIGTERM and SIGHUP during a long benchmark (or `dmover tune`): the first one ends the
//! copy that runs now and asks the sweep to stop, so emulated links and servers are
//! torn down by their destructors on the way out; a second one exits at once.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// Process id of the copy that runs now (0: none).
static CHILD: AtomicU32 = AtomicU32::new(0);

/// Starts watching for the stop signals (on a thread of its own). Until this is called,
/// the signals keep their default action.
pub fn install() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    // Register in this thread, so a signal that arrives right after `install` returns
    // is already caught.
    let mut signals = rt.block_on(async {
        Ok::<_, std::io::Error>([
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        ])
    })?;
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                let [int, term, hup] = &mut signals;
                loop {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                        _ = hup.recv() => {}
                    }
                    if REQUESTED.swap(true, Ordering::SeqCst) {
                        eprintln!(
                            "\ndmover: second interrupt, exiting without cleanup (left-over \
                             emulated links: `dmover netlab down --all`; `dmover tune`'s test \
                             files are named dmover-tune-PID-*)"
                        );
                        std::process::exit(130);
                    }
                    eprintln!("\ndmover: interrupted; stopping the copy and cleaning up");
                    let pid = CHILD.load(Ordering::SeqCst);
                    if pid != 0 {
                        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                            let _ =
                                rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                        }
                    }
                }
            })
        })?;
    Ok(())
}

/// Whether a stop signal has arrived.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// An error when a stop signal has arrived (a benchmark's sweep).
#[cfg(feature = "lab")]
pub fn check() -> anyhow::Result<()> {
    if requested() {
        anyhow::bail!("interrupted");
    }
    Ok(())
}

/// Remembers the copy that runs now (its process gets SIGTERM on an interrupt).
#[cfg(feature = "lab")]
pub fn set_child(pid: Option<u32>) {
    CHILD.store(pid.unwrap_or(0), Ordering::SeqCst);
}
