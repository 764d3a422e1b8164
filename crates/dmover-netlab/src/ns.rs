//! Network namespaces: create, enter (per thread), configure, empty and delete.
//!
//! Namespaces are the named ones of `ip netns` (`/run/netns/NAME`), so users can reach
//! them with `ip netns exec` as well. Entering one is done on a short-lived thread
//! (`setns` changes only the calling thread's namespace), so the caller's own threads
//! never move; sockets and TUN devices created there stay in that namespace.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::NetlabError;

/// Where `ip netns` keeps its named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Path of a named namespace.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// A command that runs `program` inside namespace `name` (through `ip netns exec`).
pub fn command(name: &str, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut c = std::process::Command::new("ip");
    c.args(["netns", "exec"]).arg(name).arg(program);
    c
}

/// Whether a named namespace exists.
pub fn exists(name: &str) -> bool {
    netns_path(name).exists()
}

/// Runs `ip ARGS`, returning an error with its stderr on failure.
pub fn ip(args: &[&str]) -> Result<(), NetlabError> {
    run("ip", args)
}

/// Runs an iproute2 `program` (`ip`, `tc`) with `args`, returning an error with its
/// stderr on failure.
pub fn run(program: &str, args: &[&str]) -> Result<(), NetlabError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| NetlabError::io(format!("running `{program}` (is iproute2 installed?)"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetlabError::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Creates a named namespace.
pub fn create(name: &str) -> Result<(), NetlabError> {
    ip(&["netns", "add", name])
}

/// Runs `f` on a new thread that has entered namespace `name`, and returns its result.
pub fn in_netns<T, F>(name: &str, f: F) -> Result<T, NetlabError>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let path = netns_path(name);
    let file = fs::File::open(&path)
        .map_err(|e| NetlabError::io(format!("opening namespace {}", path.display()), e))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            rustix::thread::move_into_link_name_space(
                file.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|e| NetlabError::io(format!("entering namespace {name}"), e.into()))?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Writes a sysctl of namespace `name` (`key` as a path under `/proc/sys`, e.g.
/// `net/ipv4/tcp_rmem`).
pub fn sysctl(name: &str, key: &str, value: &str) -> Result<(), NetlabError> {
    let path = Path::new("/proc/sys").join(key);
    in_netns(name, || fs::write(&path, value))?.map_err(|e| {
        NetlabError::io(
            format!(
                "setting {} = {value:?} in namespace {name}",
                key.replace('/', ".")
            ),
            e,
        )
    })
}

/// Reads a sysctl of namespace `name`.
pub fn read_sysctl(name: &str, key: &str) -> Result<String, NetlabError> {
    let path = Path::new("/proc/sys").join(key);
    in_netns(name, || fs::read_to_string(&path))?
        .map(|s| s.trim().to_string())
        .map_err(|e| {
            NetlabError::io(
                format!("reading {} in namespace {name}", key.replace('/', ".")),
                e,
            )
        })
}

/// Processes (by pid) whose network namespace is `name`, not counting this process.
pub fn pids_in(name: &str) -> Vec<u32> {
    let Ok(target) = fs::metadata(netns_path(name)) else {
        return Vec::new();
    };
    let me = std::process::id();
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| m.dev() == target.dev() && m.ino() == target.ino())
        })
        .collect()
}

/// Ends the processes inside namespace `name`: SIGTERM, then SIGKILL for those still
/// there after `grace`. Returns the pids that would not go.
pub fn kill_all_in(name: &str, grace: Duration) -> Vec<u32> {
    let pids = pids_in(name);
    if pids.is_empty() {
        return pids;
    }
    for &pid in &pids {
        signal(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + grace;
    loop {
        let left: Vec<u32> = pids_in(name);
        if left.is_empty() {
            return left;
        }
        if Instant::now() >= deadline {
            for &pid in &left {
                signal(pid, rustix::process::Signal::KILL);
            }
            std::thread::sleep(Duration::from_millis(100));
            return pids_in(name);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// Deletes namespace `name` (after ending the processes in it). Missing is fine.
pub fn delete(name: &str) -> Result<(), NetlabError> {
    if !exists(name) {
        return Ok(());
    }
    let stuck = kill_all_in(name, Duration::from_secs(2));
    let res = ip(&["netns", "del", name]);
    if exists(name) {
        return Err(NetlabError::Teardown {
            name: name.to_string(),
            detail: format!(
                "namespace {name} is still there ({}; processes left: {stuck:?})",
                res.err().map_or("no error".to_string(), |e| e.to_string())
            ),
        });
    }
    Ok(())
}

/// Names of all named namespaces starting with `prefix`.
pub fn list(prefix: &str) -> Vec<String> {
    let Ok(dir) = fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut v: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}
