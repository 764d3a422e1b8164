//! Labs on record: `/run/dmover-netlab/NAME/` holds `lab.json` (who owns the lab,
//! its hosts and link), and for a background lab `ready` once it passes traffic,
//! `stats.json` (the forwarder's statistics, rewritten every second) and
//! `forwarder.log`.
//!
//! The owner is identified by pid and the pid's start time, so a recycled pid is not
//! mistaken for a live owner. A lab whose owner is gone is stale: its namespaces and
//! directory are removed when found.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{
    ForwarderStats, Host, LinkSpec, NETNS_PREFIX, NetlabError, TopologySpec, ns, topology,
    validate_name,
};

/// Where labs are recorded.
pub const STATE_ROOT: &str = "/run/dmover-netlab";

/// Who runs a lab's forwarder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LabKind {
    /// A process using the library (a test, a benchmark); its lab lives as long as it.
    Library,
    /// The `dmover netlab` background process; `dmover netlab down` stops it.
    Daemon,
}

/// What `lab.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabRecord {
    /// The lab's name.
    pub name: String,
    /// Who owns it.
    pub kind: LabKind,
    /// The owner's pid.
    pub pid: u32,
    /// The owner's start time (clock ticks since boot, from `/proc/PID/stat`).
    pub pid_start: u64,
    /// Host a.
    pub a: Host,
    /// Host b.
    pub b: Host,
    /// The link.
    pub spec: LinkSpec,
    /// When the lab was created (seconds since the Unix epoch).
    pub created_unix: u64,
    /// For a [`crate::Topology`], its hosts and links (then `a` and `b` are the ends
    /// of its first link and `spec` is unused); absent for a two-host lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologySpec>,
}

impl LabRecord {
    /// A record for a lab owned by this process.
    pub fn new(name: &str, kind: LabKind, a: &Host, b: &Host, spec: &LinkSpec) -> LabRecord {
        let pid = std::process::id();
        LabRecord {
            name: name.to_string(),
            kind,
            pid,
            pid_start: start_time(pid).unwrap_or(0),
            a: a.clone(),
            b: b.clone(),
            spec: spec.clone(),
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            topology: None,
        }
    }

    /// Whether the owner is still running.
    pub fn owner_alive(&self) -> bool {
        start_time(self.pid).is_some_and(|t| t == self.pid_start)
    }
}

/// Start time of a process in clock ticks since boot (field 22 of `/proc/PID/stat`).
fn start_time(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it are plain.
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The state directory of lab `name`.
pub fn lab_dir(name: &str) -> PathBuf {
    Path::new(STATE_ROOT).join(name)
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetlabError {
    let what = what.into();
    move |e| NetlabError::io(what, e)
}

/// Reads a lab's record.
pub fn read_record(name: &str) -> Option<LabRecord> {
    let text = fs::read_to_string(lab_dir(name).join("lab.json")).ok()?;
    serde_json::from_str(&text).ok()
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<(), NetlabError> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, data).map_err(io(format!("writing {}", tmp.display())))?;
    fs::rename(&tmp, path).map_err(io(format!("renaming to {}", path.display())))
}

/// Claims lab `rec.name`: creates its directory and record, removing a stale lab of
/// that name (or namespaces left without a record) first. Fails when a live owner
/// holds it.
pub(crate) fn claim(rec: &LabRecord) -> Result<PathBuf, NetlabError> {
    fs::create_dir_all(STATE_ROOT).map_err(io(format!("creating {STATE_ROOT}")))?;
    let dir = lab_dir(&rec.name);
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            if let Some(old) = read_record(&rec.name) {
                if old.owner_alive() {
                    return Err(NetlabError::Exists {
                        name: rec.name.clone(),
                        pid: old.pid,
                    });
                }
            }
            tracing::info!("netlab: removing stale lab {:?}", rec.name);
            clean(&rec.name)?;
            fs::create_dir(&dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        Err(e) => return Err(io(format!("creating {}", dir.display()))(e)),
    }
    for n in namespaces_of(&rec.name) {
        if ns::exists(&n) {
            tracing::info!("netlab: removing namespace {n} left without a record");
            ns::delete(&n)?;
        }
    }
    let json = serde_json::to_vec_pretty(rec).expect("a record serialises");
    write_atomic(&dir.join("lab.json"), &json)?;
    Ok(dir)
}

/// Removes a lab's directory and log (after its namespaces are gone).
pub(crate) fn release(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir) {
        if e.kind() != ErrorKind::NotFound {
            tracing::warn!("netlab: removing {}: {e}", dir.display());
        }
    }
    let _ = fs::remove_file(dir.with_extension("log"));
}

/// The log of lab `name`'s background forwarder (beside its directory, as it is
/// opened before the lab is claimed).
pub fn log_path(name: &str) -> PathBuf {
    lab_dir(name).with_extension("log")
}

/// Marks a background lab as up.
pub fn mark_ready(name: &str) -> Result<(), NetlabError> {
    write_atomic(&lab_dir(name).join("ready"), b"")
}

/// Whether a background lab is up.
pub fn is_ready(name: &str) -> bool {
    lab_dir(name).join("ready").exists()
}

/// Writes a background lab's forwarder statistics.
pub fn write_stats(name: &str, stats: &ForwarderStats) -> Result<(), NetlabError> {
    let json = serde_json::to_vec_pretty(stats).expect("stats serialise");
    write_atomic(&lab_dir(name).join("stats.json"), &json)
}

/// Reads a background lab's latest forwarder statistics.
pub fn read_stats(name: &str) -> Option<ForwarderStats> {
    let text = fs::read_to_string(lab_dir(name).join("stats.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// The lab a namespace of ours belongs to: `dmnl-LAB-HOST` with `HOST` a host name
/// (`a`, `b` or a topology's, none holding a `-`), so `LAB` is all before the last `-`.
pub fn lab_of_netns(netns: &str) -> Option<&str> {
    let rest = netns.strip_prefix(NETNS_PREFIX)?;
    let (lab, host) = rest.rsplit_once('-')?;
    (topology::valid_host_name(host) && validate_name(lab).is_ok()).then_some(lab)
}

/// The namespaces of lab `name` that exist: `dmnl-NAME-a`, `dmnl-NAME-b` of a two-host
/// lab, `dmnl-NAME-HOST` of a topology.
pub fn namespaces_of(name: &str) -> Vec<String> {
    ns::list(&format!("{NETNS_PREFIX}{name}-"))
        .into_iter()
        .filter(|n| lab_of_netns(n) == Some(name))
        .collect()
}

/// Removes lab `name`'s namespaces (ending the processes in them) and directory.
fn clean(name: &str) -> Result<(), NetlabError> {
    for n in namespaces_of(name) {
        ns::delete(&n)?;
    }
    release(&lab_dir(name));
    Ok(())
}

/// See [`crate::remove`].
pub(crate) fn remove(name: &str) -> Result<(), NetlabError> {
    validate_name(name)?;
    let Some(rec) = read_record(name) else {
        if lab_dir(name).exists() || !namespaces_of(name).is_empty() {
            return clean(name);
        }
        return Err(NetlabError::NotFound(name.to_string()));
    };
    if rec.owner_alive() {
        match rec.kind {
            LabKind::Library => {
                return Err(NetlabError::Teardown {
                    name: name.to_string(),
                    detail: format!(
                        "it belongs to running process {} (a test or benchmark using the \
                         library), which removes it when it ends",
                        rec.pid
                    ),
                });
            }
            LabKind::Daemon => stop_daemon(&rec),
        }
    }
    clean(name)
}

/// Asks a background forwarder to tear its lab down, waiting up to 15 s, then kills
/// it.
fn stop_daemon(rec: &LabRecord) {
    let Some(pid) = rustix::process::Pid::from_raw(rec.pid as i32) else {
        return;
    };
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(15);
    while rec.owner_alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if rec.owner_alive() {
        tracing::warn!(
            "netlab: forwarder {} of lab {:?} did not stop; killing it",
            rec.pid,
            rec.name
        );
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// See [`crate::remove_all`].
pub(crate) fn remove_all() -> Result<Vec<String>, NetlabError> {
    let mut removed = Vec::new();
    let mut errors = Vec::new();
    let mut kept = Vec::new();
    for name in names() {
        if let Some(rec) = read_record(&name) {
            if rec.kind == LabKind::Library && rec.owner_alive() {
                kept.push(name);
                continue;
            }
        }
        match remove(&name) {
            Ok(()) => removed.push(name),
            Err(e) => errors.push(e.to_string()),
        }
    }
    // Namespaces of ours that no lab claims.
    for n in ns::list(crate::NETNS_PREFIX) {
        let claimed = lab_of_netns(&n).is_some_and(|lab| kept.iter().any(|k| k == lab));
        if !claimed {
            match ns::delete(&n) {
                Ok(()) => removed.push(n),
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    if errors.is_empty() {
        Ok(removed)
    } else {
        Err(NetlabError::Teardown {
            name: "*".into(),
            detail: errors.join("; "),
        })
    }
}

/// Names of the labs with a state directory.
fn names() -> Vec<String> {
    let Ok(dir) = fs::read_dir(STATE_ROOT) else {
        return Vec::new();
    };
    let mut v: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| validate_name(n).is_ok())
        .collect();
    v.sort();
    v
}

/// See [`crate::list`].
pub(crate) fn list() -> Vec<LabRecord> {
    names().iter().filter_map(|n| read_record(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_names_its_lab() {
        assert_eq!(lab_of_netns("dmnl-x-a"), Some("x"));
        assert_eq!(lab_of_netns("dmnl-x-y-c"), Some("x-y"));
        assert_eq!(lab_of_netns("dmnl-t1-tri-host2"), Some("t1-tri"));
        assert_eq!(lab_of_netns("dmnl-x-Y"), None);
        assert_eq!(lab_of_netns("dmnl-x"), None);
        assert_eq!(lab_of_netns("dmnl--a"), None);
        assert_eq!(lab_of_netns("other-x-a"), None);
    }
}
