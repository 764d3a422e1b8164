//! Replays the corpora kept in the repository (`fuzz/corpora/<target>/`, minimised
//! with `cargo fuzz cmin`) through every fuzz target, on the stable toolchain and
//! without instrumentation: libFuzzer's `main` runs each file named on its command
//! line once, and a target that panics on one fails this test with the file's name.
//! So every input a fuzzing campaign found interesting (and every crash turned into
//! a corpus file once fixed) stays checked by an ordinary `cargo test`:
//!
//! ```sh
//! cargo test --manifest-path fuzz/Cargo.toml --locked
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

/// Files per run of a target (a command line's worth).
const BATCH: usize = 256;

/// Every target, and its binary.
const TARGETS: &[(&str, &str)] = &[
    ("preamble", env!("CARGO_BIN_EXE_preamble")),
    ("data_hello", env!("CARGO_BIN_EXE_data_hello")),
    ("frame_header", env!("CARGO_BIN_EXE_frame_header")),
    ("control_frame", env!("CARGO_BIN_EXE_control_frame")),
    ("manifest", env!("CARGO_BIN_EXE_manifest")),
    ("control_roundtrip", env!("CARGO_BIN_EXE_control_roundtrip")),
    ("layout", env!("CARGO_BIN_EXE_layout")),
    ("records", env!("CARGO_BIN_EXE_records")),
    ("credentials", env!("CARGO_BIN_EXE_credentials")),
    ("server_session", env!("CARGO_BIN_EXE_server_session")),
    ("session_machines", env!("CARGO_BIN_EXE_session_machines")),
    ("drive_pair", env!("CARGO_BIN_EXE_drive_pair")),
];

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpora")
        .join(target);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs `bin` on `files` (each once); the failure names the file that failed.
fn replay(target: &str, bin: &str, files: &[PathBuf]) -> Result<(), String> {
    let out = Command::new(bin)
        .args(files)
        .env("RUST_BACKTRACE", "0")
        .output()
        .map_err(|e| format!("{target}: cannot run {bin}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    // libFuzzer says "Running: <file>" before each input; the last one failed.
    let last = err
        .lines()
        .filter_map(|l| l.strip_prefix("Running: "))
        .last()
        .unwrap_or("(unknown input)");
    let tail: Vec<&str> = err.lines().rev().take(30).collect();
    Err(format!(
        "{target}: failed on {last} ({}):\n{}",
        out.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    ))
}

#[test]
fn every_kept_input_passes_every_target() {
    let mut failures = Vec::new();
    let mut replayed = 0;
    for (target, bin) in TARGETS {
        let files = corpus(target);
        replayed += files.len();
        for batch in files.chunks(BATCH) {
            if let Err(e) = replay(target, bin, batch) {
                failures.push(e);
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("replayed {replayed} kept inputs");
}

#[test]
fn a_replay_runs_each_file_once() {
    // What the replay relies on: given files (not directories), libFuzzer's main runs
    // each once and exits, saying so; it does not fuzz.
    let dir = std::env::temp_dir().join(format!("dmover-fuzz-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<PathBuf> = (0..3u8)
        .map(|i| {
            let p = dir.join(format!("input-{i}"));
            std::fs::write(&p, [b'D', b'M', b'V', b'R', 0, 8, i, 0]).unwrap();
            p
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_preamble"))
        .args(&files)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for f in &files {
        let ran = format!("Executed {}", f.display());
        assert_eq!(err.matches(&ran).count(), 1, "{err}");
    }
}
