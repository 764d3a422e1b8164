//! What packagers and operators rely on: `--version` and the generated shell
//! completions and man pages.

use std::process::{Command, Output};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_dmover")
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
    let dir = tempfile::tempdir().unwrap();
    stdout_of(&dmover(&["man", "--dir", dir.path().to_str().unwrap()]));
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    assert!(read("dmover.1").contains("dmover\\-serve(1)"));
    assert!(read("dmover-cp.1").contains("\\-\\-chunk"));
    assert!(read("dmover-serve.1").contains("\\-\\-config"));
    assert!(read("dmover-credential-token.1").contains(".TH dmover-credential-token 1"));
    // Hidden test options stay out of the pages.
    assert!(!read("dmover-serve.1").contains("\\-\\-debug"));
}
