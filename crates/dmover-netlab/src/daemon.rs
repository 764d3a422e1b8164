//! A lab held by a background process (`dmover netlab up` starts one): it brings the
//! lab up, marks it ready, rewrites its statistics every second, and tears it down on
//! SIGTERM, SIGINT or SIGHUP (`dmover netlab down` sends SIGTERM).

use crate::state::{self, LabKind};
use crate::{Lab, LinkSpec, NetlabError};

/// Signals that end the lab.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Runs lab `name` until a stop signal arrives, then removes it. `on_ready` is called
/// once the link passes traffic.
pub fn run(name: &str, spec: &LinkSpec, on_ready: impl FnOnce(&Lab)) -> Result<(), NetlabError> {
    // Block the stop signals before any thread exists, so every thread inherits the
    // mask and the signals wait for sigtimedwait below.
    // SAFETY: an all-zero sigset_t is a valid argument to sigemptyset, which
    // initialises it; the calls only touch `set`.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: see above; `set` is a valid sigset_t.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let lab = match Lab::up_as(name, spec, LabKind::Daemon) {
        Ok(lab) => lab,
        Err(e) => {
            // Removing the half-made lab also unlinked the log that `dmover netlab up`
            // reads our error from: leave the error there again.
            let _ = std::fs::write(state::log_path(name), format!("{e}\n"));
            return Err(e);
        }
    };
    state::write_stats(name, &lab.stats())?;
    state::mark_ready(name)?;
    on_ready(&lab);
    let timeout = libc::timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    loop {
        // SAFETY: `set` is initialised; a null siginfo pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &timeout) };
        if sig > 0 {
            tracing::info!("netlab {name}: signal {sig}, removing the lab");
            break;
        }
        if let Err(e) = state::write_stats(name, &lab.stats()) {
            tracing::warn!("netlab {name}: {e}");
        }
        let s = lab.stats();
        if s.a_to_b.failed || s.b_to_a.failed {
            tracing::error!("netlab {name}: the forwarder failed; removing the lab");
            break;
        }
    }
    let _ = state::write_stats(name, &lab.stats());
    lab.down()
}
