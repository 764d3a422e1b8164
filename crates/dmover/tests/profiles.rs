//! The client's configuration file (docs/client.md, issue 47 item 2): host profiles
//! route a copy to their address and port with their user and credential, a flag and
//! the environment beat them, each server of a copy between two servers gets its own
//! credential, a bad key exits 2 naming its line, a credential file others can read is
//! warned about, and `dmover config check` shows the file. Real servers on loopback,
//! a home directory of the test's own.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-profiles-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A home directory with `config` as its `~/.config/dmover/config.toml`.
struct Home {
    dir: PathBuf,
}

impl Home {
    fn new(t: &Path, config: &str) -> Home {
        let dir = t.join("home");
        std::fs::create_dir_all(dir.join(".config/dmover")).unwrap();
        let h = Home { dir };
        h.write(config);
        h
    }

    fn config(&self) -> PathBuf {
        self.dir.join(".config/dmover/config.toml")
    }

    fn write(&self, config: &str) {
        std::fs::write(self.config(), config).unwrap();
    }

    /// `dmover ARGS` with this home (no XDG_CONFIG_HOME, no dmover variables but
    /// `env`), its known-hosts file under it.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = Command::new(bin());
        c.args(args)
            .env("HOME", &self.dir)
            .env_remove("XDG_CONFIG_HOME")
            .env("DMOVER_KNOWN_HOSTS", self.dir.join("known_hosts"));
        for v in [
            "DMOVER_TOKEN",
            "DMOVER_KEY",
            "DMOVER_USER",
            "DMOVER_LOG",
            "DMOVER_CONFIG",
            "DMOVER_SERVICE",
        ] {
            c.env_remove(v);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }
}

/// A token file of mode `mode`.
fn token(path: &Path, text: &str, mode: u32) -> PathBuf {
    std::fs::write(path, format!("{text}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    path.to_path_buf()
}

/// The port of a server's `127.0.0.1:PORT`.
fn port(srv: &Server) -> &str {
    srv.addr.rsplit_once(':').unwrap().1
}

/// A profile's address, port, and token (a file relative to the config's directory)
/// route `cp` to a server it names by no address of its own, in both endpoint forms;
/// a port on the command line, `--token-file` and `DMOVER_TOKEN` each beat the
/// profile's.
#[test]
fn a_profile_routes_a_copy_and_flags_and_the_environment_beat_it() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let server_token = token(
        &t.path().join("server.token"),
        "the token of alpha 123456",
        0o600,
    );
    let srv = Server::start(&root, &["--token-file", s(&server_token)]);
    let home = Home::new(
        t.path(),
        &format!(
            "[defaults]\nstreams = 3\n\n[host.alpha]\naddress = \"127.0.0.1\"\nport = {0}\n\
             token_file = \"alpha.token\"\nstreams = 5\n\n[host.same]\naddress = \"127.0.0.1\"\n\
             port = {0}\ntoken_file = \"alpha.token\"\n",
            port(&srv)
        ),
    );
    token(
        &home.dir.join(".config/dmover/alpha.token"),
        "the token of alpha 123456",
        0o600,
    );
    let src = t.path().join("src");
    make_small_files(&src, 5, 1);
    for d in ["one", "two", "three"] {
        std::fs::create_dir(root.join(d)).unwrap();
    }
    let o = home.run(&["cp", "--json", s(&src), "alpha:one/"], &[]);
    ok(&o);
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
    same(&src, &root.join("one/src"));
    // The profile's streams, [defaults]' for a host without, and -P beating both.
    assert_eq!(json(&o)["streams"], 5, "{}", json(&o));
    let o = home.run(&["cp", "--json", s(&src), "same:three/"], &[]);
    ok(&o);
    same(&src, &root.join("three/src"));
    assert_eq!(json(&o)["streams"], 3, "{}", json(&o));
    let o = home.run(
        &["cp", "--json", "-P", "2", s(&src), "dmover://alpha/two/"],
        &[],
    );
    ok(&o);
    same(&src, &root.join("two/src"));
    assert_eq!(json(&o)["streams"], 2, "{}", json(&o));
    // A wrong token on the command line or in the environment wins: refused (3).
    let wrong = token(
        &t.path().join("wrong.token"),
        "not the token of alpha 9",
        0o600,
    );
    let o = home.run(
        &[
            "cp",
            "-q",
            "--token-file",
            s(&wrong),
            s(&src),
            "alpha:four/",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let o = home.run(
        &["cp", "-q", s(&src), "alpha:four/"],
        &[("DMOVER_TOKEN", "not the token of alpha 9")],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    // A port the command line names wins: nothing listens on port 1 (4).
    let o = home.run(
        &[
            "cp",
            "-q",
            "--busy-wait",
            "0",
            s(&src),
            "dmover://alpha:1/four/",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("127.0.0.1:1"), "{}", stderr(&o));
    assert!(!root.join("four").exists());
    // DMOVER_CONFIG names another file; one that is not there is an error (2).
    let other = t.path().join("other.toml");
    std::fs::write(&other, "[host.beta]\naddress = \"127.0.0.1\"\n").unwrap();
    let o = home.run(
        &["cp", "-q", s(&src), "alpha:four/"],
        &[("DMOVER_CONFIG", s(&t.path().join("missing.toml")))],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("missing.toml"), "{}", stderr(&o));
}

/// A key that is not one, or a value that does not parse, fails every command of the
/// client with 2, naming the key and its line; `config check` as well.
#[test]
fn a_bad_key_exits_2_with_its_line() {
    let t = tmp();
    let home = Home::new(
        t.path(),
        "[defaults]\nstreams = 4\n\n[host.alpha]\naddress = \"127.0.0.1\"\nprot = 7701\n",
    );
    let src = t.path().join("src");
    make_small_files(&src, 1, 1);
    for args in [
        &["cp", s(&src), "alpha:x/"][..],
        &["config", "check"],
        &["config", "check", "--json"],
    ] {
        let o = home.run(args, &[]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        for w in ["line 6", "prot", "config.toml"] {
            assert!(e.contains(w), "{args:?}: no {w:?} in {e}");
        }
    }
    home.write("[defaults]\nretry_wait = \"5\"\n");
    let o = home.run(&["config", "check"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("line 2"), "{}", stderr(&o));
}

/// `config check` names the file, each host as it is dialed with its user and
/// credential file (readable, its mode), and the service; a token file others can
/// read is warned about (with `chmod 600`) by `config check` and by a copy that uses
/// it, and a missing one is an error naming the host.
#[test]
fn config_check_shows_each_host_and_warns_of_a_loose_token_file() {
    let t = tmp();
    let tight = token(
        &t.path().join("tight.token"),
        "tight token 0123456789abcdef",
        0o600,
    );
    let loose = token(
        &t.path().join("loose.token"),
        "loose token 0123456789abcdef",
        0o644,
    );
    let home = Home::new(
        t.path(),
        &format!(
            "[defaults]\nservice = \"https://dtn1.example.org:7702\"\nuser = \"carol\"\n\
             retry_wait = \"1m\"\n\n\
             [host.dtn1]\naddress = \"dtn1.example.org\"\nport = 7701\nuser = \"alice\"\n\
             token_file = \"{}\"\nstreams = 16\n\n[host.dtn2]\naddress = \"127.0.0.1\"\nport = 1\n\
             token_file = \"{}\"\n",
            tight.display(),
            loose.display()
        ),
    );
    let o = home.run(&["config", "check"], &[]);
    ok(&o);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let e = stderr(&o);
    for w in [
        format!("config {}: OK", home.config().display()),
        "service: https://dtn1.example.org:7702".into(),
        "options: retry_wait 60s".into(),
        format!(
            "host dtn1: dtn1.example.org:7701, user alice, credential token {} (readable, \
             mode 600), streams 16",
            tight.display()
        ),
        format!(
            "host dtn2: 127.0.0.1:1, user carol, credential token {} (readable, mode 644: chmod 600)",
            loose.display()
        ),
    ] {
        assert!(out.contains(&w), "no {w:?} in\n{out}");
    }
    assert!(
        e.contains(&format!("{}", loose.display())) && e.contains("chmod 600"),
        "{e}"
    );
    assert!(!e.contains("tight.token"), "{e}");
    let o = home.run(&["config", "check", "--json"], &[]);
    ok(&o);
    let j = json(&o);
    assert_eq!(j["service"], "https://dtn1.example.org:7702", "{j}");
    assert_eq!(j["hosts"][0]["dial"], "dtn1.example.org:7701", "{j}");
    assert_eq!(j["hosts"][0]["credential"]["mode_ok"], true, "{j}");
    assert_eq!(j["hosts"][0]["streams"], 16, "{j}");
    assert_eq!(j["hosts"][1]["credential"]["mode"], "644", "{j}");
    assert_eq!(j["hosts"][1]["credential"]["mode_ok"], false, "{j}");
    assert_eq!(j["warnings"].as_array().unwrap().len(), 1, "{j}");
    // A copy that uses the loose file warns too (and then fails to reach dtn2: nothing
    // listens on port 1).
    let src = t.path().join("src");
    make_small_files(&src, 1, 1);
    let o = home.run(&["cp", "--busy-wait", "0", s(&src), "dtn2:x/"], &[]);
    assert!(stderr(&o).contains("chmod 600"), "{}", stderr(&o));
    // A missing token file: 2, naming the host and its line.
    std::fs::remove_file(&loose).unwrap();
    let o = home.run(&["config", "check"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("[host.dtn2] (line 13)"),
        "{}",
        stderr(&o)
    );
    // No file: the built-in defaults.
    std::fs::remove_file(home.config()).unwrap();
    let o = home.run(&["config", "check"], &[]);
    ok(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("none (built-in defaults)"),
        "{o:?}"
    );
    // The job commands take the service from [defaults]; without one they say where
    // it goes.
    let o = home.run(&["jobs"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no job service"), "{}", stderr(&o));
    home.write("[defaults]\nservice = \"http://127.0.0.1:1\"\n");
    let o = home.run(&["jobs"], &[]);
    assert!(!stderr(&o).contains("no job service"), "{}", stderr(&o));
    assert!(stderr(&o).contains("127.0.0.1:1"), "{}", stderr(&o));
}

/// A copy between two servers whose tokens differ, each named by its profile: each
/// server gets its own user and token (B knows only bob, A only its shared token).
#[test]
fn a_copy_between_servers_gives_each_its_own_credential() {
    let t = tmp();
    let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir(&a_root).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    for d in ["pushed", "pulled", "relayed"] {
        std::fs::create_dir(b_root.join(d)).unwrap();
    }
    make_small_files(&a_root.join("data"), 20, 2);
    let a_token = token(
        &t.path().join("a.token"),
        "alpha's own token 0123456789",
        0o600,
    );
    let a = Server::start(&a_root, &["--token-file", s(&a_token), "--third-party"]);
    // B: user bob with a token of his own.
    let b_token = t.path().join("b.token");
    let o = Command::new(bin())
        .args(["credential", "token", s(&b_token)])
        .output()
        .unwrap();
    ok(&o);
    let verifier = String::from_utf8(o.stdout).unwrap();
    let b_config = t.path().join("b.toml");
    std::fs::write(
        &b_config,
        format!(
            "[exports.data]\npath = \"{}\"\nthird_party = true\n\n[users.bob]\n{verifier}\
             exports = {{ data = \"rw\" }}\n",
            b_root.display()
        ),
    )
    .unwrap();
    let b_args = ["--config".as_ref(), b_config.as_os_str()];
    let b = Server::start_with(&b_args, &b_root, None, None);
    let home = Home::new(
        t.path(),
        &format!(
            "[host.alpha]\naddress = \"127.0.0.1\"\nport = {}\ntoken_file = \"{}\"\n\n\
             [host.beta]\naddress = \"127.0.0.1\"\nport = {}\nuser = \"bob\"\n\
             token_file = \"{}\"\n",
            port(&a),
            a_token.display(),
            port(&b),
            b_token.display()
        ),
    );
    for (mode, dest) in [("push", "pushed"), ("pull", "pulled")] {
        let o = home.run(
            &[
                "cp",
                "-q",
                "--tpc",
                mode,
                "alpha:data",
                &format!("beta:data/{dest}/"),
            ],
            &[],
        );
        ok(&o);
        same(&a_root.join("data"), &b_root.join(dest).join("data"));
    }
    // Through the client, too.
    let o = home.run(
        &[
            "cp",
            "-q",
            "--via-client",
            "alpha:data",
            "beta:data/relayed/",
        ],
        &[],
    );
    ok(&o);
    same(&a_root.join("data"), &b_root.join("relayed/data"));
    // One token for both (the command line's): B refuses it.
    let o = home.run(
        &[
            "cp",
            "-q",
            "--token-file",
            s(&a_token),
            "alpha:data",
            "beta:data/refused/",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
}
