//! The walk's filters against rsync itself: for each rule list, the set of paths
//! `walk_filtered` sends equals what `rsync -n -r --out-format=%n SRC/ DST/` would
//! transfer. Skipped (with a note) when rsync is not installed.

use std::collections::BTreeSet;
use std::process::Command;

use dmover_proto::manifest::{Entry, NO_PARENT};
use dmover_store::filter::{Action, Filter, Rule};
use dmover_store::paths::{Base, source_root};
use dmover_store::walk::walk_filtered;

const FILES: &[&str] = &[
    "a.o", "a.c", "keep.o", "d/x.c", "d/x.h", "d/e/a.o", "d/keep.o", "tmp/t1", "e/tmp", "sub/x/y",
    "subx/z", "x/a/b", "a/b", "a/c/z", "foo/bar", "z", "q/a/z", "a/z", "q/a/b/z",
];

const RULES: &[&[&str]] = &[
    &["-*.o"],
    &["-/a"],
    &["-a/b"],
    &["-/a/b"],
    &["-a/*"],
    &["-a/**/z"],
    &["-**/z"],
    &["-sub/***"],
    &["-tmp/"],
    &["-tmp"],
    &["+keep.o", "-*.o"],
    &["-*.o", "+keep.o"],
    &["+*/", "+*.c", "-*"],
    &["+*.c", "-*"],
    &["-/a/**"],
    &["-x"],
    &["-[ab]*"],
    &["-[!ab]"],
    &["-?"],
    &["+/d/", "+/d/e/", "-/d/*", "-d"],
    &["-d/e/"],
    &["-/*/x.?"],
    &["-a/**/z"],
    &["-/q/**/z"],
    &["-a**/z"],
    &["+*/", "+z", "-*"],
    &["-*/"],
    &["-a/**"],
    &["-fo**"],
    &["-c/***"],
    &["+a/c/***", "-a/*"],
];

fn rel(entries: &[Entry], mut i: usize) -> String {
    let mut names = Vec::new();
    while entries[i].parent != NO_PARENT {
        names.push(String::from_utf8_lossy(&entries[i].name).into_owned());
        i = entries[i].parent as usize;
    }
    names.reverse();
    names.join("/")
}

#[test]
fn walk_filters_match_rsync() {
    if Command::new("rsync").arg("--version").output().is_err() {
        eprintln!("rsync is not installed: skipping the comparison");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for f in FILES {
        let p = src.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, f.as_bytes()).unwrap();
    }
    let mut failures = Vec::new();
    for rules in RULES {
        let mut filter = Filter::none();
        let mut args = Vec::new();
        for r in *rules {
            let (action, pat) = match r.split_at(1) {
                ("+", p) => (Action::Include, p),
                (_, p) => (Action::Exclude, p),
            };
            filter.push(Rule::new(action, pat.as_bytes()).unwrap());
            args.push(match action {
                Action::Include => format!("--include={pat}"),
                Action::Exclude => format!("--exclude={pat}"),
            });
        }
        let path = format!("{}/", src.display());
        let root = source_root(&Base::Local, path.as_bytes(), b"").unwrap();
        let walked = walk_filtered(vec![root], &filter).unwrap();
        let entries = walked.tree.entries();
        let ours: BTreeSet<String> = (1..entries.len()).map(|i| rel(entries, i)).collect();
        let out = Command::new("rsync")
            .args(["-n", "-r", "--out-format=%n"])
            .args(&args)
            .arg(&path)
            .arg(dir.path().join("nowhere/"))
            .output()
            .unwrap();
        assert!(out.status.success(), "rsync: {:?}", out);
        let theirs: BTreeSet<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.trim_end_matches('/').to_string())
            .filter(|l| !l.is_empty() && l != ".")
            .collect();
        if ours != theirs {
            failures.push(format!(
                "{rules:?}: only dmover {:?}, only rsync {:?}",
                ours.difference(&theirs).collect::<Vec<_>>(),
                theirs.difference(&ours).collect::<Vec<_>>()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
