//! The environment, read once: `main` captures it into an [`Env`] before any command
//! runs, and the commands pass the values down. No other code of dmover reads
//! environment variables; the libraries take paths and values as arguments. (clap
//! reads `DMOVER_KEY` and `DMOVER_KNOWN_HOSTS` while it parses the command line, for
//! the options of those names; `DMOVER_USER` is read here, as `--user` and a `USER@`
//! in an endpoint take precedence over it.) The README's "Environment" section
//! lists every variable dmover honours.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// What dmover takes from its environment.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// `HOME`, unless unset or empty.
    pub home: Option<PathBuf>,
    /// `XDG_CONFIG_HOME`, unless unset or empty.
    pub config_home: Option<PathBuf>,
    /// `XDG_STATE_HOME`, unless unset or empty.
    pub state_home: Option<PathBuf>,
    /// `DMOVER_CONFIG`, unless unset or empty: the client's configuration file, in
    /// place of `dmover/config.toml` in [`Env::config_dir`] (docs/client.md).
    pub config: Option<PathBuf>,
    /// `DMOVER_TOKEN`: the token a client sends when no `--token-file` is given.
    pub token: Option<Vec<u8>>,
    /// `DMOVER_USER`, unless unset or empty: the user name on a server when neither
    /// `--user` nor an endpoint's `USER@` names one.
    pub user: Option<String>,
    /// `DMOVER_LOG`: log filter directives, overriding `-v`/`--quiet`.
    pub log: Option<String>,
    /// The directories of `PATH` (`/usr/sbin:/usr/bin:/sbin:/bin` when unset), where
    /// the benchmarks look for peer tools.
    #[cfg_attr(not(feature = "lab"), allow(dead_code))]
    pub path: Vec<PathBuf>,
    /// The command line, for the benchmark reports.
    #[cfg_attr(not(feature = "lab"), allow(dead_code))]
    pub argv: Vec<String>,
    /// `NOTIFY_SOCKET`, unless unset or empty: where `dmover serve` tells systemd it is
    /// ready (`Type=notify`) and stopping; `@` starts an abstract socket name.
    pub notify_socket: Option<OsString>,
}

impl Env {
    /// Reads the environment of this process.
    pub fn capture() -> Env {
        let dir = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let path = std::env::var_os("PATH")
            .unwrap_or_else(|| OsString::from("/usr/sbin:/usr/bin:/sbin:/bin"));
        Env {
            home: dir("HOME"),
            config_home: dir("XDG_CONFIG_HOME"),
            state_home: dir("XDG_STATE_HOME"),
            config: dir("DMOVER_CONFIG"),
            token: std::env::var_os("DMOVER_TOKEN").map(OsStringExt::into_vec),
            log: std::env::var("DMOVER_LOG").ok(),
            user: std::env::var("DMOVER_USER").ok().filter(|u| !u.is_empty()),
            path: std::env::split_paths(&path).collect(),
            argv: std::env::args().collect(),
            notify_socket: std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()),
        }
    }

    /// The user's configuration directory: `$XDG_CONFIG_HOME`, else `$HOME/.config`.
    pub fn config_dir(&self) -> Option<PathBuf> {
        self.config_home
            .clone()
            .or_else(|| self.home.as_ref().map(|h| h.join(".config")))
    }

    /// The user's state directory: `$XDG_STATE_HOME`, else `$HOME/.local/state`.
    pub fn state_dir(&self) -> Option<PathBuf> {
        self.state_home
            .clone()
            .or_else(|| self.home.as_ref().map(|h| h.join(".local/state")))
    }

    /// The default known-hosts file, `dmover/known_hosts` in [`Env::config_dir`].
    pub fn known_hosts(&self) -> Option<PathBuf> {
        self.config_dir()
            .map(|d| dmover_net::known_hosts::default_path(&d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdg_directories_come_before_home() {
        let mut env = Env {
            home: Some("/home/u".into()),
            ..Env::default()
        };
        assert_eq!(env.config_dir(), Some("/home/u/.config".into()));
        assert_eq!(env.state_dir(), Some("/home/u/.local/state".into()));
        assert_eq!(
            env.known_hosts(),
            Some("/home/u/.config/dmover/known_hosts".into())
        );
        env.config_home = Some("/c".into());
        env.state_home = Some("/s".into());
        assert_eq!(env.config_dir(), Some("/c".into()));
        assert_eq!(env.state_dir(), Some("/s".into()));
        assert_eq!(env.known_hosts(), Some("/c/dmover/known_hosts".into()));
        assert_eq!(Env::default().known_hosts(), None);
    }
}
