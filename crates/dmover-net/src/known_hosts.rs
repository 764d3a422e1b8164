//! The client's known-hosts file: which key each server presented the first time.
//!
//! One server a line, `HOST:PORT FINGERPRINT` (as [`crate::tls::spki_fingerprint`]
//! prints it); blank lines and lines starting with `#` are ignored. A server not in
//! the file is added (ssh's `accept-new`); a server whose key differs from its line is
//! refused. The file is locked while it is read and appended to, so clients starting
//! at once do not interleave lines.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::NetError;

/// What [`check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// The server's key matches its line.
    Known,
    /// The server was new; its key is now in the file.
    Added,
}

/// The default file in the user's configuration directory `config_dir`
/// (`$XDG_CONFIG_HOME`, else `$HOME/.config`, as the caller resolved it):
/// `CONFIG_DIR/dmover/known_hosts`.
pub fn default_path(config_dir: &Path) -> PathBuf {
    config_dir.join("dmover").join("known_hosts")
}

/// Finds `host`'s line in the file's text: `(line number, fingerprint)`.
pub fn lookup<'t>(text: &'t str, host: &str) -> Option<(usize, &'t str)> {
    text.lines().enumerate().find_map(|(i, line)| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let mut it = line.split_whitespace();
        match (it.next(), it.next()) {
            (Some(h), Some(fp)) if h == host => Some((i + 1, fp)),
            _ => None,
        }
    })
}

/// Checks `fingerprint` for `host` against the file at `path`, adding it if the host
/// is new (creating the file and its directory as needed).
pub fn check(path: &Path, host: &str, fingerprint: &str) -> Result<Pin, NetError> {
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(NetError::file(
            "recording",
            path,
            format!("cannot pin server name {host:?}"),
        ));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| NetError::file("creating", dir, e))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| NetError::file("opening", path, e))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| NetError::file("locking", path, e))?;
    let mut text = String::new();
    f.read_to_string(&mut text)
        .map_err(|e| NetError::file("reading", path, e))?;
    match lookup(&text, host) {
        Some((_, fp)) if fp == fingerprint => Ok(Pin::Known),
        Some((line, fp)) => Err(NetError::HostKeyChanged {
            host: host.to_string(),
            file: path.display().to_string(),
            line,
            pinned: fp.to_string(),
            presented: fingerprint.to_string(),
        }),
        None => {
            let mut add = String::new();
            if !text.is_empty() && !text.ends_with('\n') {
                add.push('\n');
            }
            add.push_str(&format!("{host} {fingerprint}\n"));
            f.seek(std::io::SeekFrom::End(0))
                .and_then(|_| f.write_all(add.as_bytes()))
                .and_then(|_| f.sync_data())
                .map_err(|e| NetError::file("writing", path, e))?;
            Ok(Pin::Added)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_new_then_refuse_a_changed_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/known_hosts");
        assert_eq!(check(&path, "a:1", "sha256:AAA").unwrap(), Pin::Added);
        assert_eq!(check(&path, "a:1", "sha256:AAA").unwrap(), Pin::Known);
        assert_eq!(check(&path, "b:1", "sha256:BBB").unwrap(), Pin::Added);
        match check(&path, "b:1", "sha256:CCC") {
            Err(NetError::HostKeyChanged { line, pinned, .. }) => {
                assert_eq!((line, pinned.as_str()), (2, "sha256:BBB"));
            }
            other => panic!("{other:?}"),
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "a:1 sha256:AAA\nb:1 sha256:BBB\n");
        assert_eq!(lookup("# c\n\n  x:2   fp  \n", "x:2"), Some((3, "fp")));
        assert!(check(&path, "bad host", "fp").is_err());
    }
}
