//! The habits users bring from rsync, scp and rclone (issue 47), end to end: the real
//! binary against real servers on loopback. `-r` and `-a` are accepted, `-n` is a dry
//! run of cp and sync, `-v` lists the files (`-vv` those left as they were too), a bare
//! `--progress` is the bar, `-P` without a count says it is dmover's streams,
//! `--exclude-from` keeps its place among the rules, `sync --size-only` and
//! `--ignore-existing` keep what the destination holds, and `USER@HOST` names the user.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dmover-habits-")
        .tempdir()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `dmover SUB ARGS` with `env`, a known-hosts file of its own and no credentials
/// from the environment.
fn run(sub: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    command_of(Path::new(bin()), sub, args, env)
}

/// A usage error: exit code 2 and `says` on stderr.
fn refused(o: &Output, says: &str) {
    assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
    assert!(
        stderr(o).contains(says),
        "should say {says:?}: {}",
        stderr(o)
    );
}

/// The regular files with data under `dir`, as paths below it (what `-v` lists:
/// empty files travel in the manifest, not through the data streams).
fn files_with_data(dir: &Path) -> BTreeSet<String> {
    fn walk(dir: &Path, rel: &str, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                walk(&e.path(), &r, out);
            } else if m.is_file() && m.len() > 0 {
                out.insert(r);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, "", &mut out);
    out
}

fn lines(text: &str) -> BTreeSet<String> {
    text.lines().map(str::to_string).collect()
}

fn with_prefix(prefix: &str, set: &BTreeSet<String>) -> BTreeSet<String> {
    set.iter().map(|p| format!("{prefix}{p}")).collect()
}

/// Two regular files of `dir` and `dir2` hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[test]
fn r_and_a_are_accepted_and_trees_are_copied_whole() {
    let t = tmp();
    let src = t.path().join("run1");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    // docs/config.md's example, and rsync's -a and -r in one cluster.
    for (args, dest) in [
        (&["-r"][..], "a"),
        (&["-ra"], "b"),
        (&["--recursive", "--archive"], "c"),
    ] {
        std::fs::create_dir(root.join(dest)).unwrap();
        let url = srv.url(dest);
        let mut all = args.to_vec();
        all.extend([s(&src), url.as_str()]);
        ok(&run("cp", &all, &[]));
        same(&src, &root.join(dest).join("run1"));
    }
    ok(&run("sync", &["-ar", s(&src), &srv.url("mirror")], &[]));
    same(&src, &root.join("mirror"));
    // The help says why -r changes nothing.
    let help = stdout(&run("cp", &["--help"], &[]));
    assert!(help.contains("-r, --recursive"), "{help}");
    assert!(help.contains("always copies a directory"), "{help}");
}

#[test]
fn n_is_a_dry_run_of_cp_and_sync_that_changes_nothing() {
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    make_tree(&root.join("data"));
    let srv = Server::start(&root, &[]);
    let want = files_with_data(&src);
    let before = std::fs::read_dir(&root).unwrap().count();

    // A push: every file listed under the source's name, nothing written.
    let o = run("cp", &["-n", s(&src), &srv.url("in")], &[]);
    ok(&o);
    let sent: BTreeSet<String> = stdout(&o)
        .lines()
        .map(|l| l.strip_prefix("send ").unwrap().to_string())
        .collect();
    // Empty files are sent too (they are files); -v lists only those with data.
    assert!(sent.is_superset(&with_prefix("tree/", &want)), "{sent:?}");
    assert!(sent.contains("tree/empty"), "{sent:?}");
    assert!(
        stderr(&o).contains("dry run: would send 12 files"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("nothing was changed"), "{}", stderr(&o));
    assert!(!root.join("in").exists());
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), before);

    // --json: the counts.
    let o = run("cp", &["--dry-run", "--json", s(&src), &srv.url("in")], &[]);
    ok(&o);
    let j = json(&o);
    assert_eq!(j["type"], "dry_run", "{j}");
    assert_eq!(j["files_to_send"], 12, "{j}");
    assert_eq!(j["files_unchanged"], 0, "{j}");

    // A pull: the server lists its files, nothing is written here.
    let here = t.path().join("here");
    let o = run("cp", &["-n", &srv.url("data"), s(&here)], &[]);
    ok(&o);
    let sent = lines(&stdout(&o));
    assert!(
        sent.is_superset(&with_prefix("send data/", &want)),
        "{sent:?}"
    );
    assert!(!here.exists());
    assert!(staging_files(&root).is_empty());

    // Two sources of a pull, each under its name.
    let o = run(
        "cp",
        &["-n", &srv.url("data/sub"), &srv.url("data/one"), s(&here)],
        &[],
    );
    ok(&o);
    let sent = lines(&stdout(&o));
    assert!(sent.contains("send sub/deeper/big"), "{sent:?}");
    assert!(sent.contains("send one"), "{sent:?}");

    // sync -n: the short form of sync's dry run.
    let o = run("sync", &["-n", s(&src), &srv.url("mirror")], &[]);
    ok(&o);
    assert!(stderr(&o).contains("skip 0 unchanged"), "{}", stderr(&o));
    assert!(!root.join("mirror").exists());

    // --resume cannot be told in a copy's dry run.
    refused(
        &run("cp", &["-n", "--resume", s(&src), &srv.url("in")], &[]),
        "cp --dry-run lists every file",
    );
}

#[test]
fn v_lists_each_file_sent_and_vv_those_left_as_they_were() {
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let want = files_with_data(&src);

    // cp -v: one line per file sent on stdout, as the copy lands (under the source's
    // name).
    let o = run("cp", &["-v", s(&src), &srv.url("")], &[]);
    ok(&o);
    assert_eq!(lines(&stdout(&o)), with_prefix("tree/", &want));

    // With --json the list goes to stderr and stdout stays one JSON object.
    let o = run("cp", &["-v", "--json", s(&src), &srv.url("again")], &[]);
    ok(&o);
    assert_eq!(json(&o)["files"], 12);
    let err = lines(&stderr(&o));
    assert!(err.is_superset(&with_prefix("tree/", &want)), "{err:?}");

    // sync -v: paths below the mirror.
    let o = run("sync", &["-v", s(&src), &srv.url("mirror")], &[]);
    ok(&o);
    assert_eq!(lines(&stdout(&o)), want);

    // sync -vv after a change: the changed file sent, the others "is uptodate".
    write_file(&src.join("one"), 77, 5, 0o644, 1_700_000_000);
    let o = run("sync", &["-vv", s(&src), &srv.url("mirror")], &[]);
    ok(&o);
    let mut expect: BTreeSet<String> = want
        .iter()
        .filter(|p| *p != "one")
        .map(|p| format!("{p} is uptodate"))
        .collect();
    expect.insert("one".into());
    assert_eq!(lines(&stdout(&o)), expect);
    // -vv lists more files, not debug logs (that is -vvv).
    assert!(!stderr(&o).contains("DEBUG"), "{}", stderr(&o));
    same(&src, &root.join("mirror"));

    // A pull lists the files it receives.
    let back = t.path().join("back");
    let o = run("sync", &["-v", &srv.url("mirror"), s(&back)], &[]);
    ok(&o);
    assert_eq!(lines(&stdout(&o)), want);
    // Without -v, nothing on stdout.
    let o = run("sync", &[&srv.url("mirror"), s(&back)], &[]);
    ok(&o);
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
}

#[test]
fn a_bare_progress_is_the_bar() {
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    // Before the paths (where clap would take SRC for its value), last, before an
    // option.
    let a = srv.url("a");
    let b = srv.url("b");
    let c = srv.url("c");
    for args in [
        vec!["--progress", s(&src), a.as_str()],
        vec![s(&src), b.as_str(), "--progress"],
        vec!["--progress", "--json", s(&src), c.as_str()],
    ] {
        let o = run("cp", &args, &[]);
        ok(&o);
    }
    // Each destination was absent: it is the copy.
    for d in ["a", "b", "c"] {
        same(&src, &root.join(d));
    }
    // A mode after it is still its value.
    let o = run("cp", &["--progress", "ndjson", s(&src), &srv.url("d")], &[]);
    ok(&o);
    let last = stdout(&o).lines().last().unwrap().to_string();
    let j: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(j["type"], "summary", "{j}");
    let o = run("sync", &["--progress", s(&src), &srv.url("m")], &[]);
    ok(&o);
    same(&src, &root.join("m"));
}

#[test]
fn p_without_a_count_says_it_is_the_streams() {
    let t = tmp();
    let src = t.path().join("tree");
    make_tree(&src);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let says = "-P is the number of parallel data streams in dmover";
    let url = srv.url("x");
    for args in [
        &["-avP", s(&src), url.as_str()][..],
        &[s(&src), url.as_str(), "-avP"],
        &["-P", "--resume", s(&src), url.as_str()],
        &["-P", "many", s(&src), url.as_str()],
    ] {
        let o = run("cp", args, &[]);
        refused(&o, says);
        assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    }
    refused(&run("sync", &[s(&src), url.as_str(), "-P"], &[]), says);
    assert!(!root.join("x").exists());
    // A count is the streams, in a cluster too (scripts use it).
    let o = run("cp", &["--json", "-aP", "3", s(&src), &srv.url("")], &[]);
    ok(&o);
    assert_eq!(json(&o)["streams"], 3);
    same(&src, &root.join("tree"));
}

#[test]
fn exclude_from_keeps_its_place_among_the_rules() {
    let t = tmp();
    let src = t.path().join("tree");
    for f in [
        "a.log", "keep.log", "b.txt", "tmp/x", "sub/c.o", "sub/d.c", "#hash",
    ] {
        write_file(&src.join(f), 1, 10, 0o644, 1_600_000_000);
    }
    let list = t.path().join("excludes");
    // rsync's reading: comments, blank lines, a CR before the newline, `+ `/`- `.
    std::fs::write(
        &list,
        "# logs and objects\n*.log\r\n\n; build output\n*.o\n- tmp/\n+ d.c\n",
    )
    .unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    let got = |dest: &str| files_with_data(&root.join(dest));
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();

    // The file's rules where it stands: an --include before it wins over them...
    let o = run(
        "sync",
        &[
            "--include",
            "keep.log",
            "--exclude-from",
            s(&list),
            s(&src),
            &srv.url("m1"),
        ],
        &[],
    );
    ok(&o);
    assert_eq!(got("m1"), set(&["keep.log", "b.txt", "sub/d.c", "#hash"]));
    // ... and after it comes too late.
    let o = run(
        "sync",
        &[
            "--exclude-from",
            s(&list),
            "--include",
            "keep.log",
            s(&src),
            &srv.url("m2"),
        ],
        &[],
    );
    ok(&o);
    assert_eq!(got("m2"), set(&["b.txt", "sub/d.c", "#hash"]));
    // --include-from: the file's plain lines are includes, `- ` an exclude.
    let includes = t.path().join("includes");
    std::fs::write(&includes, "- sub/\n*.txt\n").unwrap();
    let o = run(
        "cp",
        &[
            "--include-from",
            s(&includes),
            "--exclude",
            "*",
            s(&src),
            &srv.url(""),
        ],
        &[],
    );
    ok(&o);
    assert_eq!(got("tree"), set(&["b.txt"]));
    // A pull: the rules travel to the server, read from the file here.
    let back = t.path().join("back");
    let o = run(
        "sync",
        &["--exclude-from", s(&list), &srv.url("m1"), s(&back)],
        &[],
    );
    ok(&o);
    assert_eq!(files_with_data(&back), set(&["b.txt", "sub/d.c", "#hash"]));
    // A missing file, two readers of stdin: nothing is copied.
    let o = run(
        "cp",
        &["--exclude-from", "/nonexistent", s(&src), &srv.url("m3")],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--exclude-from /nonexistent"),
        "{}",
        stderr(&o)
    );
    refused(
        &run(
            "cp",
            &[
                "--exclude-from",
                "-",
                "--files-from",
                "-",
                s(&src),
                &srv.url("m3"),
            ],
            &[],
        ),
        "stdin (-) can be read once",
    );
    assert!(!root.join("m3").exists());
}

/// `sync --size-only` and `--ignore-existing`, push and pull: which files are sent,
/// which stay as the destination holds them, what the dry run says first.
#[test]
fn size_only_and_ignore_existing_keep_what_the_destination_holds() {
    let t = tmp();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start(&root, &[]);
    // The source: `same` (same size as the mirror's, other content and mtime),
    // `longer` (another size), `empty` (empty here, data there), `new`.
    let src = t.path().join("src");
    let fill = |dir: &Path| {
        write_file(&dir.join("same"), 1, 4000, 0o644, 1_700_000_000);
        write_file(&dir.join("longer"), 2, 5000, 0o644, 1_700_000_000);
        write_file(&dir.join("empty"), 3, 0, 0o644, 1_700_000_000);
        write_file(&dir.join("sub/new"), 4, 3000, 0o644, 1_700_000_000);
    };
    // The destination's older copies.
    let stale = |dir: &Path| {
        write_file(&dir.join("same"), 11, 4000, 0o644, 1_600_000_000);
        write_file(&dir.join("longer"), 12, 4500, 0o644, 1_600_000_000);
        write_file(&dir.join("empty"), 13, 100, 0o644, 1_600_000_000);
    };
    fill(&src);
    for (i, push) in [true, false].into_iter().enumerate() {
        for mode in ["--size-only", "--ignore-existing"] {
            // Push: the mirror on the server; pull: a mirror here of the server's.
            let (from, mirror, from_url, to_url);
            if push {
                mirror = root.join(format!("m{i}{mode}"));
                from = src.clone();
                from_url = s(&src).to_string();
                to_url = srv.url(&format!("m{i}{mode}"));
            } else {
                let name = format!("p{i}{mode}");
                from = root.join(&name);
                fill(&from);
                from_url = srv.url(&name);
                mirror = t.path().join(format!("here{mode}"));
                to_url = s(&mirror).to_string();
            }
            stale(&mirror);
            let dry = run("sync", &["-n", "--json", mode, &from_url, &to_url], &[]);
            ok(&dry);
            let d = json(&dry);
            let o = run("sync", &["--json", "-vv", mode, &from_url, &to_url], &[]);
            ok(&o);
            // -vv's lines went to stderr beside the JSON.
            let listed = lines(&stderr(&o));
            let j = json(&o);
            let what = format!("{mode}, push {push}: {j} {}", stderr(&o));
            // `same` stays as the mirror holds it.
            assert!(
                !same_bytes(&from.join("same"), &mirror.join("same")),
                "{what}"
            );
            assert!(listed.contains("same is uptodate"), "{what}");
            assert!(listed.contains("sub/new"), "{what}");
            assert!(same_bytes(&from.join("sub/new"), &mirror.join("sub/new")));
            if mode == "--size-only" {
                // Another size is sent; the empty file is rewritten as every run does.
                assert!(
                    same_bytes(&from.join("longer"), &mirror.join("longer")),
                    "{what}"
                );
                assert!(
                    same_bytes(&from.join("empty"), &mirror.join("empty")),
                    "{what}"
                );
                assert_eq!(j["files_unchanged"], 1, "{what}");
                assert_eq!(j["bytes_sent"], 5000 + 3000, "{what}");
                assert_eq!(d["files_to_send"], 3, "{d}");
                // A pull gives the kept file the source's mtime (rsync -t); a push
                // leaves it as it was.
                let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
                assert_eq!(
                    mtime(&from.join("same")) == mtime(&mirror.join("same")),
                    !push,
                    "{what}"
                );
            } else {
                // Nothing already there is touched, the empty file neither.
                assert!(
                    !same_bytes(&from.join("longer"), &mirror.join("longer")),
                    "{what}"
                );
                assert_eq!(std::fs::metadata(mirror.join("empty")).unwrap().len(), 100);
                assert_eq!(j["bytes_sent"], 3000, "{what}");
                assert_eq!(d["files_to_send"], 1, "{d}");
                assert!(listed.contains("longer is uptodate"), "{what}");
            }
            assert!(staging_files(&mirror).is_empty());
            // Again: nothing to send.
            let o = run("sync", &["--json", mode, &from_url, &to_url], &[]);
            ok(&o);
            assert_eq!(json(&o)["bytes_sent"], 0, "{mode}, push {push}");
            if !push {
                std::fs::remove_dir_all(&mirror).unwrap();
            }
        }
    }
    // Options of sync, one at a time, not with -c, not between two servers.
    let url = srv.url("x");
    refused(
        &run("cp", &["--size-only", s(&src), &url], &[]),
        "options of dmover sync",
    );
    refused(
        &run("sync", &["--size-only", "-c", s(&src), &url], &[]),
        "cannot be used with",
    );
    refused(
        &run(
            "sync",
            &["--size-only", "--ignore-existing", s(&src), &url],
            &[],
        ),
        "cannot be used with",
    );
    refused(
        &run("sync", &["--ignore-existing", &srv.url("a"), &url], &[]),
        "not supported on a sync between two servers",
    );
}

/// `USER@HOST` names the dmover user as --user would; --user naming another is a
/// usage error; the endpoint's user goes before DMOVER_USER.
#[test]
fn user_at_host_is_the_user() {
    let t = tmp();
    let data = t.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mut lines = String::new();
    let mut tokens = Vec::new();
    for user in ["alice", "bob"] {
        let token = t.path().join(format!("{user}.token"));
        let o = Command::new(bin())
            .args(["credential", "token", s(&token)])
            .output()
            .unwrap();
        ok(&o);
        lines.push_str(&format!(
            "[users.{user}]\n{}exports = {{ data = \"rw\" }}\n",
            String::from_utf8(o.stdout).unwrap()
        ));
        tokens.push(token);
    }
    let config = t.path().join("server.toml");
    std::fs::write(
        &config,
        format!("[exports.data]\npath = \"{}\"\n\n{lines}", data.display()),
    )
    .unwrap();
    let srv = Server::start_with(
        &["--config".as_ref(), config.as_os_str()],
        &data,
        None,
        None,
    );
    let src = t.path().join("tree");
    make_tree(&src);
    let alice = s(&tokens[0]);
    let at = |user: &str, path: &str| format!("dmover://{user}@{}/{path}", srv.addr);

    // alice@ with alice's token: in.
    ok(&run(
        "cp",
        &["--token-file", alice, s(&src), &at("alice", "data/a")],
        &[],
    ));
    same(&src, &data.join("a"));
    // The endpoint's user goes before DMOVER_USER, and names the same as --user.
    let o = run(
        "cp",
        &["--token-file", alice, s(&src), &at("alice", "data/b")],
        &[("DMOVER_USER", "bob")],
    );
    ok(&o);
    ok(&run(
        "cp",
        &[
            "--user",
            "alice",
            "--token-file",
            alice,
            s(&src),
            &at("alice", "data/c"),
        ],
        &[],
    ));
    // bob@ with alice's token: refused by the server (it is the user sent).
    let o = run(
        "cp",
        &["--token-file", alice, s(&src), &at("bob", "data/d")],
        &[],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(!data.join("d").exists());
    // A pull and a sync take it too.
    let back = t.path().join("back");
    ok(&run(
        "sync",
        &["--token-file", alice, &at("alice", "data/a"), s(&back)],
        &[],
    ));
    same(&src, &back);
    // --user naming another, or two users: usage errors before any connection.
    refused(
        &run(
            "cp",
            &["--user", "bob", s(&src), &at("alice", "data/e")],
            &[],
        ),
        "--user bob and alice@ name different users",
    );
    refused(
        &run("cp", &[&at("alice", "data/a"), &at("bob", "data/e")], &[]),
        "the endpoints name two users",
    );
    refused(
        &run(
            "cp",
            &[s(&src), &format!("dmover://al:pw@{}/x", srv.addr)],
            &[],
        ),
        "invalid user name \"al:pw\"",
    );
    refused(&run("cp", &[s(&src), "@dtn1:x"], &[]), "invalid user name");
    // The help says it is a dmover user.
    let help = stdout(&run("cp", &["--help"], &[]));
    assert!(help.contains("[USER@]HOST:PATH"), "{help}");
    assert!(help.contains("not an account on its host"), "{help}");
}
