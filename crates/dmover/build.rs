//! Records the git commit the binary is built from, for `dmover --version`, as the
//! compile-time variable `DMOVER_GIT_COMMIT`: the short hash from `git rev-parse`, else
//! `DMOVER_GIT_COMMIT` from the build's environment (for builds from a source tarball),
//! else `unknown`. Never fails the build: without git, or outside a checkout, the
//! commit is just unknown.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DMOVER_GIT_COMMIT");
    let commit = git(&["rev-parse", "--short", "HEAD"])
        .or_else(|| {
            std::env::var("DMOVER_GIT_COMMIT")
                .ok()
                .filter(|c| !c.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=DMOVER_GIT_COMMIT={commit}");
    // Run again when HEAD moves: HEAD itself (a checkout), the branch it points to (a
    // commit) and packed-refs (where a branch may live). Files that do not exist are
    // not named: cargo would run this script on every build.
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watch.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watch.into_iter().flatten() {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// `git ARGS` in the package's directory: its trimmed output if it succeeded.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}
