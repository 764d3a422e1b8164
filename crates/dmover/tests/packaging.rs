//! What packagers and operators rely on: `--version`, the generated shell completions
//! and man pages, the systemd unit (and the server's readiness notification it needs),
//! and the example configuration in packaging/ and docs/config.md.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dmover_core::access::ConfigFile;

mod common;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_dmover")
}

/// The repository's top directory.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn dmover(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("running dmover")
}

fn stdout_of(o: &Output) -> String {
    assert!(
        o.status.success(),
        "dmover failed with {:?}:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).expect("UTF-8 output")
}

#[test]
fn version_names_the_commit_and_the_protocol_versions() {
    let (min, max) = (
        dmover_proto::MIN_PROTOCOL_VERSION,
        dmover_proto::PROTOCOL_VERSION,
    );
    let protocol = if min == max {
        format!("protocol version {max}")
    } else {
        format!("protocol versions {min} to {max}")
    };
    // Built from this checkout: the commit is its HEAD's (build.rs runs again when HEAD
    // moves); built without git it is "unknown".
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    for flag in ["--version", "-V"] {
        let line = stdout_of(&dmover(&[flag]));
        let line = line.trim_end();
        let prefix = format!("dmover {} (commit ", env!("CARGO_PKG_VERSION"));
        let suffix = format!(", {protocol})");
        assert!(
            line.starts_with(&prefix) && line.ends_with(&suffix),
            "{flag}: {line:?}"
        );
        let built = &line[prefix.len()..line.len() - suffix.len()];
        match &commit {
            Some(c) => assert_eq!(built, c, "{flag}: {line:?}"),
            None => assert!(!built.is_empty() && !built.contains(' '), "{line:?}"),
        }
    }
    // Subcommands answer too, with their name.
    assert!(stdout_of(&dmover(&["serve", "--version"])).starts_with("dmover-serve "));
}

#[test]
fn completions_cover_the_subcommands_and_their_options() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout_of(&dmover(&["completions", shell]));
        // Options without their dashes: fish writes `-l listen`.
        for word in ["cp", "serve", "chunk", "listen", "streams", "token-file"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    // The shells that are installed here parse their scripts.
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let file = dir.path().join(shell);
        std::fs::write(&file, stdout_of(&dmover(&["completions", shell]))).unwrap();
        match Command::new(shell).arg("-n").arg(&file).output() {
            Ok(o) => assert!(
                o.status.success(),
                "{shell} -n: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(_) => eprintln!("{shell} not installed: its completions are not parsed"),
        }
    }
    let o = dmover(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("possible values"));
}

#[test]
fn man_pages_cover_the_subcommands_and_their_options() {
    let page = stdout_of(&dmover(&["man"]));
    assert!(page.contains(".TH dmover 1"), "{page}");
    for sub in [
        "dmover\\-cp(1)",
        "dmover\\-serve(1)",
        "dmover\\-credential(1)",
    ] {
        assert!(page.contains(sub), "dmover.1 lacks {sub}");
    }
    // The sections a script's author looks for, before VERSION.
    let at = |words: &str| {
        page.find(words)
            .unwrap_or_else(|| panic!("dmover.1 lacks {words:?}"))
    };
    let sections = [
        ".SH \"EXIT STATUS\"",
        ".SH ENVIRONMENT",
        ".SH FILES",
        ".SH EXAMPLES",
        ".SH VERSION",
    ];
    let places = sections.map(at);
    assert!(places.is_sorted(), "{sections:?} at {places:?}");
    for words in [
        "\\fB23\\fR\nA partial copy",
        "\\fB130, 143\\fR",
        "rerun with \\-\\-resume",
        "\\fBDMOVER_TOKEN\\fR",
        "\\fBNOTIFY_SOCKET\\fR",
        "known_hosts",
        "/etc/dmover/server.toml",
        "130|143)",
    ] {
        at(words);
    }
    // The short summary of dmover --help is not repeated.
    assert!(!page.contains("Exit status: 0 success"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    stdout_of(&dmover(&["man", "--dir", dir.path().to_str().unwrap()]));
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    assert!(read("dmover.1").contains("dmover\\-serve(1)"));
    assert_eq!(
        read("dmover.1"),
        page,
        "dmover man --dir writes the same dmover.1"
    );
    assert!(read("dmover-cp.1").contains("\\-\\-chunk"));
    // Options clap also takes from the environment say so.
    assert!(read("dmover-cp.1").contains("\\fBDMOVER_KEY\\fR environment variable"));
    assert!(read("dmover-serve.1").contains("\\-\\-config"));
    assert!(read("dmover-credential-token.1").contains(".TH dmover-credential-token 1"));
    // Hidden test options stay out of the pages.
    assert!(!read("dmover-serve.1").contains("\\-\\-debug"));
}

/// `dmover serve` under `Type=notify`: READY=1 once it listens, STOPPING=1 on SIGTERM.
#[test]
fn serve_tells_systemd_it_is_ready_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let socket = dir.path().join("notify");
    let manager = UnixDatagram::bind(&socket).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut child = Command::new(bin())
        .arg("serve")
        .arg("--root")
        .arg(&root)
        .args(["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.path().join("state"))
        .env("NOTIFY_SOCKET", &socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().strip_prefix("dmover: listening on ").unwrap();

    let mut buf = [0u8; 512];
    let n = manager
        .recv(&mut buf)
        .expect("no READY=1 from dmover serve");
    let msg = std::str::from_utf8(&buf[..n]).unwrap();
    let lines: Vec<&str> = msg.lines().collect();
    assert!(lines.contains(&"READY=1"), "{msg:?}");
    assert!(
        lines.contains(&format!("STATUS=listening on {addr}").as_str()),
        "{msg:?}"
    );
    // It listens by then.
    std::net::TcpStream::connect(addr).expect("connecting after READY=1");

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let n = manager
        .recv(&mut buf)
        .expect("no STOPPING=1 from dmover serve");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

fn unit_file() -> String {
    std::fs::read_to_string(repo().join("packaging/dmover.service")).unwrap()
}

fn sync_template() -> String {
    std::fs::read_to_string(repo().join("packaging/dmover-sync@.service")).unwrap()
}

/// The values of `key=` lines in a unit file, in order.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_unit_starts_the_packaged_config_hardened() {
    let unit = unit_file();
    for (key, value) in [
        ("Type", "notify"),
        (
            "ExecStart",
            "/usr/bin/dmover serve --config /etc/dmover/server.toml",
        ),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        // SO_SNDBUFFORCE/SO_RCVBUFFORCE past the host's limit (docs/tuning.md), and no
        // other capability.
        ("CapabilityBoundingSet", "CAP_NET_ADMIN"),
        ("AmbientCapabilities", "CAP_NET_ADMIN"),
        ("StateDirectory", "dmover"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
    ] {
        assert_eq!(unit_values(&unit, key), [value], "{key}=");
    }
    assert!(!unit_values(&unit, "LimitNOFILE").is_empty());
    // Every export the example lets someone write to is writable under the unit, and
    // optional ("-"): a host without that directory still starts the server.
    let entries: Vec<String> = unit_values(&unit, "ReadWritePaths")
        .iter()
        .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect();
    assert!(!entries.is_empty(), "no ReadWritePaths=");
    let writable: Vec<String> = entries
        .iter()
        .map(|e| {
            e.strip_prefix('-')
                .unwrap_or_else(|| panic!("ReadWritePaths={e} is not optional (no \"-\")"))
                .to_string()
        })
        .collect();
    let path = repo().join("packaging/server.toml");
    let cfg = ConfigFile::load(&path).unwrap();
    let (exports, _) = cfg.access(&path).unwrap();
    for e in exports.iter().filter(|e| !e.read_only) {
        let p = e.path.to_str().unwrap().to_string();
        assert!(writable.contains(&p), "ReadWritePaths= lacks {p}");
    }
    // The state directory systemd makes is the one the config names.
    assert_eq!(cfg.state_dir.as_deref(), Some(Path::new("/var/lib/dmover")));
}

/// `systemd-analyze verify` on the units, where systemd is installed.
#[test]
fn systemd_analyze_verifies_the_units() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Warnings about a unit written as `file` and verified as `unit` (an instance of a
    // template is verified by its name, the template's file beside it): verify names
    // the file or the unit in each (it exits 0 on most).
    let verify = |file: &str, text: &str, unit: &str| -> Result<Vec<String>, String> {
        std::fs::write(dir.path().join(file), text).unwrap();
        // --man=no: the man page named in Documentation= is not installed here.
        let o = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(dir.path().join(unit))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        let warnings = stderr
            .lines()
            .filter(|l| l.contains(file) || l.contains(unit))
            .map(str::to_string)
            .collect();
        if o.status.success() {
            Ok(warnings)
        } else {
            Err(stderr)
        }
    };
    // First a unit that is surely fine: if systemd-analyze cannot judge even that here
    // (no systemd in a container, say), it cannot judge ours.
    let probe = "[Unit]\nDescription=probe\n[Service]\nType=notify\nExecStart=/bin/sh -c true\n";
    let name = "dmover-probe.service";
    match verify(name, probe, name) {
        Ok(w) if w.is_empty() => {}
        r => {
            eprintln!("skipped: systemd-analyze verify does not work here: {r:?}");
            return;
        }
    }
    // verify checks that the program exists: point it at the binary under test.
    let unit = unit_file().replace("/usr/bin/dmover", bin());
    let name = "dmover.service";
    assert_eq!(verify(name, &unit, name), Ok(vec![]));
    let template = sync_template().replace("/usr/bin/dmover", bin());
    let (file, instance) = ("dmover-sync@.service", "dmover-sync@instrument.service");
    assert_eq!(verify(file, &template, instance), Ok(vec![]));
    // And it would have noticed a mistake in either.
    for (file, unit, text) in [
        ("dmover-broken.service", "dmover-broken.service", &unit),
        (
            "dmover-broken@.service",
            "dmover-broken@x.service",
            &template,
        ),
    ] {
        let broken = text.replace("NoNewPrivileges=yes", "NoNewPrivileges=maybe");
        let warnings = verify(file, &broken, unit).unwrap_or_else(|e| vec![e]);
        assert!(!warnings.is_empty(), "a broken {file} passed");
    }
}

/// Text with `# key = value` lines uncommented: the optional keys the example shows
/// commented out.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if is_key_line(rest) => rest,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `key = ...` with a bare key.
fn is_key_line(l: &str) -> bool {
    l.split_once(" = ").is_some_and(|(k, _)| {
        !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    })
}

/// The keys the server's parser accepts in `section` (a TOML prefix that opens it),
/// from its own words: it names them when it refuses an unknown key.
fn accepted_keys(section: &str) -> Vec<String> {
    let text = format!("{section}__no_such_key = 1\n");
    let e = ConfigFile::parse(&text, Path::new("probe.toml"))
        .expect_err("an unknown key was accepted")
        .to_string();
    let expected = e
        .split_once("expected")
        .unwrap_or_else(|| panic!("unexpected error: {e}"))
        .1;
    let keys: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(!keys.is_empty(), "no keys in {e}");
    keys
}

#[test]
fn the_example_config_names_every_key_and_parses() {
    let path = repo().join("packaging/server.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    for text in [text.clone(), uncommented(&text)] {
        let cfg = ConfigFile::parse(&text, &path).unwrap();
        let (exports, users) = cfg.access(&path).unwrap();
        assert!(!exports.is_empty() && !users.is_empty());
    }
    let keys_in_example: Vec<&str> = text
        .lines()
        .map(|l| l.strip_prefix("# ").filter(|r| is_key_line(r)).unwrap_or(l))
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
        .collect();
    let mut sections = vec![
        ("top-level", accepted_keys("")),
        (
            "[exports.NAME]",
            accepted_keys("[exports.x]\npath = \"/x\"\n"),
        ),
        ("[users.NAME]", accepted_keys("[users.x]\n")),
        ("[jobs]", accepted_keys("[jobs]\n")),
    ];
    // Tables are sections of their own, not `key = ` lines.
    sections[0]
        .1
        .retain(|k| k != "exports" && k != "users" && k != "jobs");
    // The older spellings of the durations are accepted (with a warning) and
    // documented, but the example shows the new ones (giving both is an error).
    let older = [
        "handshake_timeout_secs",
        "idle_timeout_secs",
        "tpc_capability_ttl_secs",
        "retry_wait_secs",
        "max_retry_wait_secs",
        "deadline_secs",
        "keep_finished_days",
    ];
    for (section, keys) in &sections {
        for key in keys.iter().filter(|k| !older.contains(&k.as_str())) {
            assert!(
                keys_in_example.contains(&key.as_str()),
                "packaging/server.toml does not show {section} {key}"
            );
        }
    }
    assert!(
        text.contains("\n[exports.") && text.contains("\n[users.") && text.contains("\n[jobs]")
    );

    // docs/config.md shows the same example, whole, and a row for every key.
    let doc = std::fs::read_to_string(repo().join("docs/config.md")).unwrap();
    assert!(
        doc.contains(&format!("```toml\n{text}```\n")),
        "docs/config.md's example differs from packaging/server.toml"
    );
    for (section, keys) in &sections {
        for key in keys {
            assert!(
                doc.contains(&format!("| `{key}` |")),
                "docs/config.md has no row for {section} {key}"
            );
        }
    }
}

/// The template for `sync --watch` is sandboxed as the server is (the same lines), but
/// may read sources under /home, runs as dmover, reads its instance's settings, and is
/// not restarted after failures that a restart would meet again.
#[test]
fn the_sync_template_is_hardened_as_the_server() {
    let (unit, template) = (unit_file(), sync_template());
    for key in [
        "NoNewPrivileges",
        "CapabilityBoundingSet",
        "AmbientCapabilities",
        "ProtectSystem",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "RestrictAddressFamilies",
        "RestrictNamespaces",
        "MemoryDenyWriteExecute",
        "SystemCallFilter",
        "User",
        "Group",
        "LimitNOFILE",
    ] {
        let values = unit_values(&template, key);
        assert!(!values.is_empty(), "the template has no {key}=");
        assert_eq!(values, unit_values(&unit, key), "{key}=");
    }
    for (key, value) in [
        ("ProtectHome", "read-only"),
        ("EnvironmentFile", "/etc/dmover/sync/%i.env"),
        ("Restart", "on-failure"),
        // Usage errors and refused credentials or keys.
        ("RestartPreventExitStatus", "2 3"),
        ("StateDirectory", "dmover-sync"),
    ] {
        assert_eq!(unit_values(&template, key), [value], "{key}=");
    }
    assert!(unit_values(&template, "ReadWritePaths").is_empty());
}

/// `NAME=value` lines of an EnvironmentFile= as systemd reads them (as far as the
/// example needs): `#` comments and blank lines skipped, a value in double quotes
/// unquoted.
fn env_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{l:?}"));
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// An ExecStart= line's arguments as systemd makes them: `${NAME}` is NAME's value as
/// one argument, `$NAME` its value split at whitespace (no argument when unset or
/// empty); the last assignment of a name wins.
fn exec_words(line: &str, vars: &[(String, String)]) -> Vec<String> {
    let get = |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut words = Vec::new();
    for w in line.split_whitespace() {
        if let Some(name) = w.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
            words.push(get(name).unwrap_or_default());
        } else if let Some(name) = w.strip_prefix('$') {
            let value = get(name).unwrap_or_default();
            words.extend(value.split_whitespace().map(str::to_string));
        } else {
            words.push(w.to_string());
        }
    }
    words
}

#[test]
fn exec_words_expand_as_systemd_does() {
    let vars = [
        ("A".to_string(), "one two".to_string()),
        ("A".to_string(), "x  y".to_string()),
        ("E".to_string(), String::new()),
    ];
    assert_eq!(
        exec_words("/bin/p $A ${A} $E $U end", &vars),
        ["/bin/p", "x", "y", "x  y", "end"]
    );
    assert_eq!(
        env_file("# c\n\nA=\"b c\"\nD=e f\n"),
        [
            ("A".to_string(), "b c".to_string()),
            ("D".to_string(), "e f".to_string())
        ]
    );
}

/// A child killed when dropped (also when a test fails).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to 30 s for `done`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waited for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The template's ExecStart, expanded as systemd does with the example settings
/// (packaging/sync.env, its SRC, DST and key file swapped for this test's) and the
/// unit's Environment=, runs a watch that ships files to a real server as the example's
/// user, keeps out what the example's OPTIONS exclude, pins the server's key where the
/// unit says, and ends cleanly on SIGTERM, systemd's stop (exit 0).
#[test]
fn the_sync_template_runs_a_watch_with_the_example_settings() {
    let t = tempfile::tempdir().unwrap();
    let (src, data) = (t.path().join("src"), t.path().join("data"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&data).unwrap();
    std::fs::write(src.join("before.dat"), b"written before the start\n").unwrap();
    std::fs::write(src.join("scratch.tmp"), b"excluded by OPTIONS\n").unwrap();
    let key = t.path().join("instrument.key");
    let keys_line = stdout_of(&dmover(&["credential", "key", key.to_str().unwrap()]));

    let mut settings =
        env_file(&std::fs::read_to_string(repo().join("packaging/sync.env")).unwrap());
    let user = settings
        .iter()
        .find(|(k, _)| k == "DMOVER_USER")
        .map(|(_, v)| v.clone())
        .expect("the example names DMOVER_USER");
    let cfg = t.path().join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "[exports.data]\npath = \"{}\"\n[users.{user}]\n{keys_line}exports = {{ data = \"rw\" }}\n",
            data.display()
        ),
    )
    .unwrap();
    let server =
        common::Server::start_with(&["--config".as_ref(), cfg.as_os_str()], &data, None, None);
    let mut swapped = 0;
    for (k, v) in &mut settings {
        let new = match k.as_str() {
            "SRC" => src.to_str().unwrap().to_string(),
            "DST" => server.url("data/instrument"),
            "DMOVER_KEY" => key.to_str().unwrap().to_string(),
            _ => continue,
        };
        *v = new;
        swapped += 1;
    }
    assert_eq!(
        swapped, 3,
        "the example lacks SRC, DST or DMOVER_KEY: {settings:?}"
    );

    let template = sync_template();
    // %S: the root of state directories; systemd makes the unit's StateDirectory= in it.
    let state = t.path().join("state");
    std::fs::create_dir_all(state.join("dmover-sync")).unwrap();
    // Environment= first, then the file's settings (which win).
    let mut vars: Vec<(String, String)> = unit_values(&template, "Environment")
        .iter()
        .map(|v| {
            let (k, v) = v.split_once('=').unwrap();
            (k.to_string(), v.replace("%S", state.to_str().unwrap()))
        })
        .collect();
    vars.extend(settings);
    let exec = unit_values(&template, "ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let words = exec_words(&exec[0], &vars);
    assert_eq!(words[..3], ["/usr/bin/dmover", "sync", "--watch"]);

    let log = t.path().join("watch.log");
    let mut cmd = Command::new(bin());
    cmd.args(&words[1..]);
    for name in [
        "DMOVER_TOKEN",
        "DMOVER_KEY",
        "DMOVER_USER",
        "DMOVER_KNOWN_HOSTS",
    ] {
        cmd.env_remove(name);
    }
    let mut watch = Killed(
        cmd.envs(vars.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mirror = data.join("instrument");
    let arrived =
        |name: &str, want: &[u8]| std::fs::read(mirror.join(name)).ok().as_deref() == Some(want);
    wait_until("the catch-up", || {
        if let Some(st) = watch.0.try_wait().unwrap() {
            panic!("the watch ended with {st:?}:\n{}", log_text());
        }
        arrived("before.dat", b"written before the start\n")
    });
    std::fs::write(src.join("after.dat"), b"written while watched\n").unwrap();
    wait_until("a file written while watched", || {
        arrived("after.dat", b"written while watched\n")
    });
    assert!(
        !mirror.join("scratch.tmp").exists(),
        "OPTIONS' --exclude did not hold"
    );
    let pinned = std::fs::read_to_string(state.join("dmover-sync/known_hosts")).unwrap();
    assert!(pinned.contains(&server.addr), "{pinned}");

    let pid = rustix::process::Pid::from_child(&watch.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = watch.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", log_text());
}

/// The lab's commands (bench, netlab) are in the default build. A build without the
/// `lab` feature leaves them out of its help, man pages and completions, and a script
/// that runs one learns why (a usage error, exit 2).
#[test]
fn lab_commands_are_in_the_lab_build_only() {
    let help = stdout_of(&dmover(&["--help"]));
    let pages = tempfile::tempdir().unwrap();
    stdout_of(&dmover(&["man", "--dir", pages.path().to_str().unwrap()]));
    let completions = stdout_of(&dmover(&["completions", "bash"]));
    for cmd in ["bench", "netlab"] {
        // In the help, a man page, the completions.
        let shown = [
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{cmd} "))),
            pages.path().join(format!("dmover-{cmd}.1")).exists(),
            completions.contains(&format!("dmover__subcmd__{cmd}")),
        ];
        let o = dmover(&[cmd, "--help"]);
        if cfg!(feature = "lab") {
            assert_eq!(shown, [true; 3], "{cmd}\n{help}");
            assert!(o.status.success(), "dmover {cmd} --help: {o:?}");
        } else {
            assert_eq!(shown, [false; 3], "{cmd}\n{help}");
            assert_eq!(o.status.code(), Some(2), "dmover {cmd} --help: {o:?}");
            let err = String::from_utf8_lossy(&o.stderr);
            let says = format!("this build has no `dmover {cmd}` (built without the `lab` feature");
            assert!(err.contains(&says), "{err}");
        }
    }
}

/// scripts/package-deb.sh packages every file of packaging/, and docs/packaging.md
/// explains every setting of the template's example.
#[test]
fn the_package_and_its_page_cover_the_packaging_files() {
    let script = std::fs::read_to_string(repo().join("scripts/package-deb.sh")).unwrap();
    let mut files = 0;
    for entry in std::fs::read_dir(repo().join("packaging")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            script.contains(&format!("\"$REPO/packaging/{name}\"")),
            "scripts/package-deb.sh does not install packaging/{name}"
        );
        files += 1;
    }
    assert!(files >= 5, "{files} files in packaging/");
    let page = std::fs::read_to_string(repo().join("docs/packaging.md")).unwrap();
    let example = std::fs::read_to_string(repo().join("packaging/sync.env")).unwrap();
    // The settings, and those shown commented out.
    let names: Vec<&str> = example
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'))
        .collect();
    assert!(
        names.contains(&"SRC") && names.contains(&"DMOVER_TOKEN"),
        "{names:?}"
    );
    for name in names {
        assert!(
            page.contains(&format!("| `{name}`")) || page.contains(&format!(" `{name}` |")),
            "docs/packaging.md's table lacks {name}"
        );
    }
}
