//! What packagers and operators rely on: `--version`, the generated shell completions
//! and man pages, the systemd unit (and the server's readiness notification it needs),
//! and the example configuration in packaging/ and docs/config.md.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dmover_core::access::ConfigFile;

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
        ("CapabilityBoundingSet", ""),
        ("StateDirectory", "dmover"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
    ] {
        assert_eq!(unit_values(&unit, key), [value], "{key}=");
    }
    assert!(!unit_values(&unit, "LimitNOFILE").is_empty());
    // Every export the example lets someone write to is writable under the unit.
    let writable: Vec<String> = unit_values(&unit, "ReadWritePaths")
        .iter()
        .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
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

/// `systemd-analyze verify` on the unit, where systemd is installed.
#[test]
fn systemd_analyze_verifies_the_unit() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Warnings about the unit: verify names the file in each (it exits 0 on most).
    let verify = |name: &str, text: &str| -> Result<Vec<String>, String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        // --man=no: the man page named in Documentation= is not installed here.
        let o = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        let warnings = stderr
            .lines()
            .filter(|l| l.contains(name))
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
    match verify("dmover-probe.service", probe) {
        Ok(w) if w.is_empty() => {}
        r => {
            eprintln!("skipped: systemd-analyze verify does not work here: {r:?}");
            return;
        }
    }
    // verify checks that the program exists: point it at the binary under test.
    let unit = unit_file().replace("/usr/bin/dmover", bin());
    assert_eq!(verify("dmover.service", &unit), Ok(vec![]));
    // And it would have noticed a mistake.
    let broken = unit.replace("NoNewPrivileges=yes", "NoNewPrivileges=maybe");
    let warnings = verify("dmover-broken.service", &broken).unwrap_or_else(|e| vec![e]);
    assert!(!warnings.is_empty(), "a broken unit passed");
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
