//! The copy tools dmover is compared with, and how to run each on loopback: which
//! programs it needs, which server it talks to (started here, bound to 127.0.0.1, stopped
//! when the [`Servers`] are dropped) and the command that copies a dataset.
//!
//! | tool          | server                              | copy (pull into the destination)                   |
//! |---------------|-------------------------------------|----------------------------------------------------|
//! | `dmover-push` | `dmover serve --root DST`           | `dmover cp --json SRC dmover://…/NAME`             |
//! | `dmover-pull` | `dmover serve --root SRCS --read-only` | `dmover cp --json dmover://…/NAME DST`          |
//! | `cp`          | none                                | `cp -r SRC DST`                                    |
//! | `rsync`       | `rsync --daemon`, module per side   | `rsync -a rsync://…/src/NAME/ DST/`                |
//! | `rsync-push`  | the same daemon                     | `rsync -a SRC/ rsync://…/dst/rsync-push/NAME/`     |
//! | `rsync-ssh`   | `sshd` with a throwaway key         | `rsync -a -e "ssh -F CFG" host:SRC/ DST/`          |
//! | `scp`         | the same `sshd`                     | `scp -r -q -F CFG host:SRC DST`                    |
//! | `gridftp`     | `globus-gridftp-server` (anonymous) | `globus-url-copy -r -cd -p 4 -cc 4 -pp -fast …`    |
//! | `gridftp-default` | the same server                 | `globus-url-copy -r -cd …` (untuned)               |
//! | `xrdcp`       | `xrootd` as user `xrootd`           | `xrdcp -r --parallel 4 --streams 4 -s root://… DIR/` |
//!
//! Servers run as children of this process in the foreground, each in a process group of
//! its own that is killed as a whole on drop (so forked helpers die with it), and inherit
//! no descriptors but stdio (see [`close_inherited_fds`]): a daemon that outlived us must
//! never hold, say, a benchmark lock file open.

use std::fs;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::report::{find_program, tool_version};

/// A copy tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    /// dmover, pushing to a server.
    DmoverPush,
    /// dmover, pulling from a server.
    DmoverPull,
    /// `cp -r`.
    Cp,
    /// rsync from an rsync daemon (no encryption).
    Rsync,
    /// rsync over ssh.
    RsyncSsh,
    /// scp.
    Scp,
    /// GridFTP: globus-url-copy from a globus-gridftp-server.
    GridFtp,
    /// XRootD: xrdcp from an xrootd server.
    Xrdcp,
    /// rsync pushing into an rsync daemon (the daemon writes).
    RsyncPush,
    /// GridFTP with globus-url-copy's defaults (one stream, one file at a time).
    GridFtpDefault,
}

impl Tool {
    /// Every tool, in table order.
    pub const ALL: [Tool; 10] = [
        Tool::DmoverPush,
        Tool::DmoverPull,
        Tool::Cp,
        Tool::Rsync,
        Tool::RsyncPush,
        Tool::RsyncSsh,
        Tool::Scp,
        Tool::GridFtp,
        Tool::GridFtpDefault,
        Tool::Xrdcp,
    ];

    /// The tools a comparison runs unless told otherwise: one tuned way per peer.
    pub const DEFAULT: [Tool; 8] = [
        Tool::DmoverPush,
        Tool::DmoverPull,
        Tool::Cp,
        Tool::Rsync,
        Tool::RsyncSsh,
        Tool::Scp,
        Tool::GridFtp,
        Tool::Xrdcp,
    ];

    /// Name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Tool::DmoverPush => "dmover-push",
            Tool::DmoverPull => "dmover-pull",
            Tool::Cp => "cp",
            Tool::Rsync => "rsync",
            Tool::RsyncSsh => "rsync-ssh",
            Tool::Scp => "scp",
            Tool::GridFtp => "gridftp",
            Tool::Xrdcp => "xrdcp",
            Tool::RsyncPush => "rsync-push",
            Tool::GridFtpDefault => "gridftp-default",
        }
    }

    /// Parses [`Tool::name`].
    pub fn from_name(s: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.name() == s.trim())
    }

    /// Programs the tool needs, and the Debian package that has them.
    fn needs(self) -> (&'static [&'static str], &'static str) {
        match self {
            Tool::DmoverPush | Tool::DmoverPull => (&[], ""),
            Tool::Cp => (&["cp"], "coreutils"),
            Tool::Rsync | Tool::RsyncPush => (&["rsync"], "rsync"),
            Tool::RsyncSsh => (
                &["rsync", "ssh", "sshd", "ssh-keygen"],
                "rsync openssh-server",
            ),
            Tool::Scp => (&["scp", "ssh", "sshd", "ssh-keygen"], "openssh-server"),
            Tool::GridFtp | Tool::GridFtpDefault => (
                &["globus-gridftp-server", "globus-url-copy"],
                "globus-gridftp-server-progs globus-gass-copy-progs",
            ),
            Tool::Xrdcp => (&["xrootd", "xrdcp"], "xrootd-server xrootd-client"),
        }
    }

    /// `Err(why)` when the tool cannot run here (missing programs, not root); programs
    /// are looked up in `path` (the caller's `PATH`), see [`find_program`].
    pub fn available(self, path: &[PathBuf]) -> Result<(), String> {
        let (progs, pkg) = self.needs();
        let missing: Vec<&str> = progs
            .iter()
            .copied()
            .filter(|p| find_program(p, path).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "missing: {} (apt-get install {pkg})",
                missing.join(", ")
            ));
        }
        let root = rustix::process::geteuid().is_root();
        if matches!(
            self,
            Tool::RsyncSsh | Tool::Scp | Tool::Xrdcp | Tool::GridFtp
        ) && !root
        {
            return Err("needs root here (its server runs as root or as its own user)".into());
        }
        Ok(())
    }

    /// The tool's version line, if it has one.
    pub fn version(self, dmover: &Path) -> Option<String> {
        let d = dmover.to_string_lossy();
        match self {
            Tool::DmoverPush | Tool::DmoverPull => tool_version(&d, &["--version"]),
            Tool::Cp => tool_version("cp", &["--version"]),
            Tool::Rsync | Tool::RsyncPush | Tool::RsyncSsh => tool_version("rsync", &["--version"]),
            Tool::Scp => tool_version("ssh", &["-V"]),
            Tool::GridFtp | Tool::GridFtpDefault => tool_version("globus-url-copy", &["-version"]),
            Tool::Xrdcp => tool_version("xrdcp", &["--version"]),
        }
    }

    /// The server this tool copies from, if any.
    fn server(self) -> Option<ServerKind> {
        match self {
            Tool::DmoverPush => Some(ServerKind::DmoverDst),
            Tool::DmoverPull => Some(ServerKind::DmoverSrc),
            Tool::Cp => None,
            Tool::Rsync | Tool::RsyncPush => Some(ServerKind::Rsyncd),
            Tool::RsyncSsh | Tool::Scp => Some(ServerKind::Sshd),
            Tool::GridFtp | Tool::GridFtpDefault => Some(ServerKind::GridFtp),
            Tool::Xrdcp => Some(ServerKind::Xrootd),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ServerKind {
    DmoverSrc,
    DmoverDst,
    Rsyncd,
    Sshd,
    GridFtp,
    Xrootd,
}

/// Where data and server state live.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Directory holding the datasets (each a subdirectory); served read-only.
    pub src_root: PathBuf,
    /// Directory the copies go to (`DST/<tool>/<dataset>`).
    pub dst_root: PathBuf,
    /// Configuration, keys and logs of the servers.
    pub state: PathBuf,
    /// The dmover binary.
    pub dmover: PathBuf,
    /// Directories programs are looked up in (the caller's `PATH`).
    pub path: Vec<PathBuf>,
}

/// The running servers.
pub struct Servers {
    layout: Layout,
    children: Vec<(ServerKind, Child)>,
    ports: Vec<(ServerKind, u16)>,
    failed: Vec<(ServerKind, String)>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            kill_group(c);
        }
    }
}

/// Kills `child`'s whole process group (it leads one: see [`Servers`]) and reaps it.
pub fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: plain syscalls on a process group this process created.
        unsafe {
            libc::kill(-pid, libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above; the group may be gone already.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Marks every descriptor above stderr close-on-exec, so nothing this process holds (a
/// lock taken by `flock(1)`, a pipe) leaks into the servers and tools it starts.
pub fn close_inherited_fds() {
    let Ok(dir) = fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_GETFD/F_SETFD on a descriptor number; a closed one just fails.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// The uid and gid of a user.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let text = fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name) && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}

/// A free port on 127.0.0.1 (bound and released: a small race, harmless here).
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_port(port: u16, child: &mut Child, limit: Duration) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("exited with {st} before listening"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "not listening on port {port} after {} s",
        limit.as_secs()
    ))
}

fn run_ok(c: &mut Command) -> Result<(), String> {
    let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{c:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Servers {
    /// Starts the servers `tools` need. A server that fails is remembered: its tools'
    /// copies then fail with the reason ([`Servers::failure`]).
    pub fn start(layout: Layout, tools: &[Tool]) -> Servers {
        let mut s = Servers {
            layout,
            children: Vec::new(),
            ports: Vec::new(),
            failed: Vec::new(),
        };
        // The dmover servers keep their keys in the state directory; a stale pin from
        // another run's keys would refuse them.
        let _ = fs::remove_file(s.layout.state.join("known_hosts"));
        let mut kinds: Vec<ServerKind> = tools.iter().filter_map(|t| t.server()).collect();
        kinds.dedup();
        for k in kinds {
            if s.port(k).is_some() || s.failed.iter().any(|(f, _)| *f == k) {
                continue;
            }
            if let Err(e) = s.start_one(k) {
                s.failed.push((k, e));
            }
        }
        s
    }

    fn port(&self, k: ServerKind) -> Option<u16> {
        self.ports.iter().find(|(x, _)| *x == k).map(|(_, p)| *p)
    }

    /// Why `tool`'s server is not running, if it is not.
    pub fn failure(&self, tool: Tool) -> Option<String> {
        let k = tool.server()?;
        self.failed
            .iter()
            .find(|(x, _)| *x == k)
            .map(|(_, e)| e.clone())
    }

    fn log(&self, name: &str) -> Result<fs::File, String> {
        let p = self.layout.state.join(name);
        fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))
    }

    fn spawn(
        &mut self,
        k: ServerKind,
        port: u16,
        c: &mut Command,
        log: &str,
    ) -> Result<(), String> {
        let out = self.log(log)?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        use std::os::unix::process::CommandExt;
        let mut child = c
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {c:?}: {e}"))?;
        let r = wait_port(port, &mut child, Duration::from_secs(20));
        if r.is_err() {
            kill_group(&mut child);
        }
        self.children.push((k, child));
        r.map_err(|e| {
            let log = fs::read_to_string(self.layout.state.join(log)).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            format!(
                "{e}; log: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )
        })?;
        self.ports.push((k, port));
        Ok(())
    }

    fn start_one(&mut self, k: ServerKind) -> Result<(), String> {
        let l = self.layout.clone();
        let port = free_port().map_err(|e| e.to_string())?;
        let st = &l.state;
        let w = |p: &Path, text: String| {
            fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))
        };
        match k {
            ServerKind::DmoverSrc | ServerKind::DmoverDst => {
                let (root, ro) = if k == ServerKind::DmoverSrc {
                    (&l.src_root, true)
                } else {
                    (&l.dst_root, false)
                };
                let mut c = Command::new(&l.dmover);
                c.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--root"])
                    .arg(root)
                    .arg("--state-dir")
                    .arg(st.join(if ro { "dmover-src" } else { "dmover-dst" }))
                    .env_remove("DMOVER_TOKEN");
                if ro {
                    c.arg("--read-only");
                }
                let log = if ro {
                    "dmover-src.log"
                } else {
                    "dmover-dst.log"
                };
                self.spawn(k, port, &mut c, log)
            }
            ServerKind::Rsyncd => {
                let cfg = st.join("rsyncd.conf");
                w(
                    &cfg,
                    format!(
                        "address = 127.0.0.1\nport = {port}\nuse chroot = no\nuid = root\n\
                         gid = root\nlog file = {}\n[src]\npath = {}\nread only = yes\n\
                         [dst]\npath = {}\nread only = no\n",
                        st.join("rsyncd.log").display(),
                        l.src_root.display(),
                        l.dst_root.display()
                    ),
                )?;
                let mut c = Command::new("rsync");
                c.args(["--daemon", "--no-detach"])
                    .arg(format!("--config={}", cfg.display()));
                self.spawn(k, port, &mut c, "rsyncd.out")
            }
            ServerKind::Sshd => {
                fs::create_dir_all("/run/sshd").map_err(|e| format!("/run/sshd: {e}"))?;
                let key = st.join("id_ed25519");
                let host_key = st.join("host_ed25519");
                for p in [&key, &host_key] {
                    if !p.exists() {
                        run_ok(
                            Command::new("ssh-keygen")
                                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                                .arg(p),
                        )?;
                    }
                }
                let auth = st.join("authorized_keys");
                fs::copy(st.join("id_ed25519.pub"), &auth).map_err(|e| e.to_string())?;
                let sshd_cfg = st.join("sshd_config");
                w(
                    &sshd_cfg,
                    format!(
                        "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
                         PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\n\
                         StrictModes no\nPidFile {}\nSubsystem sftp internal-sftp\n",
                        host_key.display(),
                        auth.display(),
                        st.join("sshd.pid").display()
                    ),
                )?;
                w(
                    &st.join("ssh_config"),
                    format!(
                        "Host dmover-bench\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  \
                         IdentityFile {}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  \
                         UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n",
                        key.display()
                    ),
                )?;
                let sshd = find_program("sshd", &self.layout.path).ok_or("sshd not found")?;
                let mut c = Command::new(sshd);
                c.args(["-D", "-e", "-f"]).arg(&sshd_cfg);
                self.spawn(k, port, &mut c, "sshd.log")
            }
            ServerKind::GridFtp => {
                let mut c = Command::new("globus-gridftp-server");
                c.args(["-p", &port.to_string()])
                    .args([
                        "-control-interface",
                        "127.0.0.1",
                        "-data-interface",
                        "127.0.0.1",
                    ])
                    .args([
                        "-aa",
                        "-anonymous-user",
                        "root",
                        "-allow-root",
                        "-threads",
                        "2",
                    ])
                    .arg("-l")
                    .arg(st.join("gridftp.log"));
                self.spawn(k, port, &mut c, "gridftp.out")
            }
            ServerKind::Xrootd => {
                if user_ids("xrootd").is_none() {
                    run_ok(Command::new("useradd").args([
                        "--system",
                        "--no-create-home",
                        "--shell",
                        "/usr/sbin/nologin",
                        "xrootd",
                    ]))?;
                }
                let admin = st.join("xrd");
                fs::create_dir_all(&admin).map_err(|e| e.to_string())?;
                run_ok(Command::new("chown").args(["-R", "xrootd"]).arg(&admin))?;
                let (uid, gid) = user_ids("xrootd").ok_or("no user xrootd")?;
                // The server runs as xrootd: it must reach the datasets.
                let mut d = Some(l.src_root.as_path());
                while let Some(p) = d {
                    if let Ok(m) = fs::metadata(p) {
                        let mode = m.permissions().mode();
                        if mode & 0o005 != 0o005 {
                            let _ =
                                fs::set_permissions(p, fs::Permissions::from_mode(mode | 0o005));
                        }
                    }
                    d = p.parent();
                }
                let cfg = st.join("xrootd.cfg");
                w(
                    &cfg,
                    format!(
                        "all.export {}\nall.adminpath {}\nall.pidpath {}\nxrd.port {port}\n",
                        l.src_root.display(),
                        admin.display(),
                        admin.display()
                    ),
                )?;
                // XRootD refuses to run as root: the child drops to the xrootd user itself.
                use std::os::unix::process::CommandExt;
                let mut c = Command::new("xrootd");
                c.uid(uid)
                    .gid(gid)
                    .arg("-c")
                    .arg(&cfg)
                    .args(["-p", &port.to_string(), "-I", "v4", "-l"])
                    .arg(admin.join("xrootd.log"));
                self.spawn(k, port, &mut c, "xrootd.out")
            }
        }
    }

    /// The command that copies dataset `name` (a directory in the source root) with
    /// `tool` so that it lands at `dst_root/<tool>/<name>` (the parent exists, the target
    /// does not).
    pub fn copy_command(&self, tool: Tool, name: &str) -> Result<Command, String> {
        if let Some(e) = self.failure(tool) {
            return Err(format!("server not running: {e}"));
        }
        let l = &self.layout;
        let src = l.src_root.join(name);
        let parent = l.dst_root.join(tool.name());
        let dst = parent.join(name);
        let port = |k| self.port(k).ok_or_else(|| "server not started".to_string());
        let mut c;
        match tool {
            Tool::DmoverPush => {
                c = Command::new(&l.dmover);
                c.args(["cp", "--json", "--quiet"]).arg(&src).arg(format!(
                    "dmover://127.0.0.1:{}/{}/{name}",
                    port(ServerKind::DmoverDst)?,
                    tool.name()
                ));
            }
            Tool::DmoverPull => {
                c = Command::new(&l.dmover);
                c.args(["cp", "--json", "--quiet"])
                    .arg(format!(
                        "dmover://127.0.0.1:{}/{name}",
                        port(ServerKind::DmoverSrc)?
                    ))
                    .arg(&dst);
            }
            Tool::Cp => {
                c = Command::new("cp");
                c.arg("-r").arg(&src).arg(&dst);
            }
            Tool::Rsync => {
                c = Command::new("rsync");
                c.arg("-a")
                    .arg(format!(
                        "rsync://127.0.0.1:{}/src/{name}/",
                        port(ServerKind::Rsyncd)?
                    ))
                    .arg(format!("{}/", dst.display()));
            }
            Tool::RsyncPush => {
                c = Command::new("rsync");
                c.arg("-a").arg(format!("{}/", src.display())).arg(format!(
                    "rsync://127.0.0.1:{}/dst/{}/{name}/",
                    port(ServerKind::Rsyncd)?,
                    tool.name()
                ));
            }
            Tool::GridFtpDefault => {
                c = Command::new("globus-url-copy");
                c.args(["-r", "-cd"])
                    .arg(format!(
                        "ftp://127.0.0.1:{}{}/",
                        port(ServerKind::GridFtp)?,
                        src.display()
                    ))
                    .arg(format!("file://{}/", dst.display()));
            }
            Tool::RsyncSsh => {
                port(ServerKind::Sshd)?;
                c = Command::new("rsync");
                c.arg("-a")
                    .arg("-e")
                    .arg(format!("ssh -F {}", l.state.join("ssh_config").display()))
                    .arg(format!("dmover-bench:{}/", src.display()))
                    .arg(format!("{}/", dst.display()));
            }
            Tool::Scp => {
                port(ServerKind::Sshd)?;
                c = Command::new("scp");
                c.args(["-r", "-q", "-F"])
                    .arg(l.state.join("ssh_config"))
                    .arg(format!("dmover-bench:{}", src.display()))
                    .arg(&dst);
            }
            Tool::GridFtp => {
                c = Command::new("globus-url-copy");
                c.args(["-r", "-cd", "-p", "4", "-cc", "4", "-pp", "-fast"])
                    .arg(format!(
                        "ftp://127.0.0.1:{}{}/",
                        port(ServerKind::GridFtp)?,
                        src.display()
                    ))
                    .arg(format!("file://{}/", dst.display()));
            }
            Tool::Xrdcp => {
                c = Command::new("xrdcp");
                c.args(["-r", "--parallel", "4", "--streams", "4", "--nopbar", "-s"])
                    .arg(format!(
                        "root://127.0.0.1:{}/{}",
                        port(ServerKind::Xrootd)?,
                        src.display()
                    ))
                    .arg(format!("{}/", parent.display()));
            }
        }
        // dmover clients pin the servers' keys in a known-hosts file of the run's own.
        c.env_remove("DMOVER_TOKEN")
            .env("DMOVER_KNOWN_HOSTS", l.state.join("known_hosts"))
            .stdin(Stdio::null());
        Ok(c)
    }

    /// Where `tool`'s copy of dataset `name` lands.
    pub fn copy_path(&self, tool: Tool, name: &str) -> PathBuf {
        self.layout.dst_root.join(tool.name()).join(name)
    }

    /// The exact command line of `tool` for docs and results (server ports elided).
    pub fn describe(tool: Tool) -> &'static str {
        match tool {
            Tool::DmoverPush => {
                "dmover cp SRC dmover://127.0.0.1:PORT/DST (defaults: 4 streams, auto chunk, direct I/O auto)"
            }
            Tool::DmoverPull => "dmover cp dmover://127.0.0.1:PORT/SRC DST (defaults)",
            Tool::Cp => "cp -r SRC DST",
            Tool::Rsync => "rsync -a rsync://127.0.0.1:PORT/src/NAME/ DST/ (daemon, no encryption)",
            Tool::RsyncSsh => "rsync -a -e ssh HOST:SRC/ DST/ (OpenSSH, default cipher)",
            Tool::Scp => "scp -r HOST:SRC DST (OpenSSH, SFTP protocol)",
            Tool::GridFtp => {
                "globus-url-copy -r -cd -p 4 -cc 4 -pp -fast ftp://127.0.0.1:PORT/SRC/ file:///DST/"
            }
            Tool::Xrdcp => {
                "xrdcp -r --parallel 4 --streams 4 --nopbar -s root://127.0.0.1:PORT/SRC DSTPARENT/"
            }
            Tool::RsyncPush => {
                "rsync -a SRC/ rsync://127.0.0.1:PORT/dst/NAME/ (daemon writes, no encryption)"
            }
            Tool::GridFtpDefault => {
                "globus-url-copy -r -cd ftp://127.0.0.1:PORT/SRC/ file:///DST/ (defaults: 1 stream)"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A server that forks (as runuser and GridFTP do) leaves no process behind.
    #[test]
    fn killing_a_group_takes_forked_children_along() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("sleep 60 & echo $! > {}; wait", pidfile.display()))
            .process_group(0)
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while fs::read_to_string(&pidfile).map_or(true, |s| s.trim().is_empty()) {
            assert!(Instant::now() < until, "no grandchild pid");
            std::thread::sleep(Duration::from_millis(10));
        }
        let grandchild: i32 = fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        kill_group(&mut child);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            // A zombie awaiting its reaper (init) counts as gone.
            let stat = fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .chars()
                .next();
            if matches!(state, None | Some('Z')) {
                break;
            }
            assert!(Instant::now() < until, "grandchild {grandchild} survived");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn inherited_descriptors_become_close_on_exec() {
        let f = fs::File::open("/proc/self/stat").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        // SAFETY: clearing FD_CLOEXEC on our own descriptor.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        close_inherited_fds();
        // SAFETY: reading the flags of our own descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert!(flags & libc::FD_CLOEXEC != 0);
    }

    #[test]
    fn tool_names_round_trip() {
        for t in Tool::ALL {
            assert_eq!(Tool::from_name(t.name()), Some(t));
        }
        assert_eq!(Tool::from_name("bbcp"), None);
    }
}
