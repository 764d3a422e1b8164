//! Which entries of a source tree travel: `--exclude`, `--include` and `--files-from`,
//! with rsync's pattern rules, applied during the walk (before the manifest).
//!
//! Paths are relative to the source root (the source directory's contents, as for
//! `rsync -r SRC/ DST`): the root itself is always sent. Rules, in the order given:
//! - the first rule that matches decides; an entry no rule matches is included;
//! - a pattern starting with `/` is anchored to the source root; otherwise it matches
//!   the end of the path at a component boundary: a pattern without `/` (a trailing
//!   `/` aside) matches the last component at any depth, `a/b` matches `a/b` and
//!   `x/a/b`; a pattern with `**` matches the whole path or any suffix after a `/`
//!   (`a/**/z` matches `a/b/z` and `x/a/b/z`, but not `a/z`: only a leading `**/`
//!   may match no directory, so `**/z` matches `z`); rsync's behaviour, checked
//!   against rsync itself by `tests/filter_rsync.rs`;
//! - `*` matches any run of characters but `/`, `?` one character but `/`, `**` any run
//!   including `/`, `[...]` a class (`[!...]`/`[^...]` negated, ranges), `\` escapes;
//!   `dir/***` matches `dir` and everything below it;
//! - a pattern ending with `/` matches directories only;
//! - an excluded directory is not descended into, so nothing below it is sent (an
//!   include of something below cannot bring it back, as in rsync).
//!
//! `--files-from` lists paths relative to the source, one per line (blank lines and
//! lines starting with `#` or `;` are skipped, a leading `/` or `./` ignored): only
//! those entries, the directories leading to them, and everything below a listed
//! directory (dmover copies recursively, like `rsync -r --files-from`) are sent. The
//! rules above apply to them too. A line may hold at most [`MAX_LIST_LINE`] bytes
//! (`PATH_MAX`, as rsync reads its lists), and the list takes memory linear in its
//! size: the paths in one buffer, sorted, and a directory leads to a listed path when
//! a listed path starts with it (one binary search), so no prefix is ever stored.
//!
//! Why not `globset`: it matches a whole path against a glob and has no notion of
//! rsync's "end of the path at a component boundary" for unanchored patterns, nor of
//! directory-only rules or first-match-wins include/exclude lists; the matcher rsync
//! needs is a small byte-wise wildcard match, written here.

/// Include or exclude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send what matches.
    Include,
    /// Leave out what matches (and, for a directory, everything below it).
    Exclude,
}

/// One `--include` or `--exclude` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    action: Action,
    /// The pattern without its leading `/` and trailing `/`.
    pattern: Vec<u8>,
    anchored: bool,
    dir_only: bool,
    /// `dir/***`: the directory and everything below.
    and_below: bool,
    /// Slashes in `pattern` (how many trailing components it spans when unanchored).
    slashes: usize,
    /// Contains `**`.
    wild2: bool,
}

impl Rule {
    /// A rule from a pattern as the user wrote it.
    pub fn new(action: Action, pattern: &[u8]) -> Result<Self, String> {
        if pattern.is_empty() {
            return Err("an empty pattern".into());
        }
        let mut p = pattern;
        let anchored = p.first() == Some(&b'/');
        if anchored {
            p = &p[1..];
        }
        let mut dir_only = false;
        while p.len() > 1 && p.ends_with(b"/") {
            dir_only = true;
            p = &p[..p.len() - 1];
        }
        let mut and_below = false;
        if p.len() > 4 && p.ends_with(b"/***") {
            and_below = true;
            p = &p[..p.len() - 4];
        } else if p == b"***" {
            // Everything.
            p = b"**";
        }
        if p.is_empty() || p == b"/" {
            return Err(format!(
                "pattern {:?} matches nothing",
                String::from_utf8_lossy(pattern)
            ));
        }
        Ok(Rule {
            action,
            pattern: p.to_vec(),
            anchored,
            dir_only,
            and_below,
            slashes: p.iter().filter(|&&b| b == b'/').count(),
            wild2: p.windows(2).any(|w| w == b"**"),
        })
    }

    /// Whether the rule matches `path` (relative to the source root, no leading `/`).
    pub fn matches(&self, path: &[u8], is_dir: bool) -> bool {
        if self.and_below {
            // `dir/***`: `dir` itself (a directory) or anything below a match of `dir`.
            if is_dir && self.matches_plain(path) {
                return true;
            }
            let mut end = path.len();
            while let Some(i) = path[..end].iter().rposition(|&b| b == b'/') {
                if self.matches_plain(&path[..i]) {
                    return true;
                }
                end = i;
            }
            return false;
        }
        if self.dir_only && !is_dir {
            return false;
        }
        self.matches_plain(path)
    }

    fn matches_plain(&self, path: &[u8]) -> bool {
        if self.anchored {
            return wildmatch(&self.pattern, path);
        }
        if self.wild2 {
            // The whole path, or (as rsync does) any suffix starting after a `/`.
            return wildmatch(&self.pattern, path)
                || path
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'/')
                    .any(|(i, _)| wild(&self.pattern, &path[i + 1..], false));
        }
        // The last `slashes + 1` components.
        let mut start = path.len();
        let mut seen = 0;
        loop {
            match path[..start].iter().rposition(|&b| b == b'/') {
                Some(i) if seen < self.slashes => {
                    seen += 1;
                    start = i;
                }
                Some(i) => {
                    start = i + 1;
                    break;
                }
                None => {
                    if seen < self.slashes {
                        return false;
                    }
                    start = 0;
                    break;
                }
            }
        }
        wildmatch(&self.pattern, &path[start..])
    }

    /// Include or exclude.
    pub fn action(&self) -> Action {
        self.action
    }
}

/// rsync's wildcard match of `text` against `pat` (whole text): `*`, `?`, `**`,
/// `[...]`, `\`.
pub fn wildmatch(pat: &[u8], text: &[u8]) -> bool {
    wild(pat, text, true)
}

/// [`wildmatch`]; `zero_dirs`: a leading `**/` may match no directory at all.
fn wild(pat: &[u8], text: &[u8], zero_dirs: bool) -> bool {
    // Iterative with backtracking to the last star; `**` may cross `/`, `*` may not.
    // A `*` that cannot cross `/` is handled by not letting its backtrack pass a `/`.
    fn class(pat: &[u8], c: u8) -> Option<(bool, usize)> {
        // pat starts after '['; returns (matched, bytes consumed including ']').
        let mut i = 0;
        let negate = matches!(pat.first(), Some(b'!') | Some(b'^'));
        if negate {
            i += 1;
        }
        let mut matched = false;
        let mut first = true;
        loop {
            let &b = pat.get(i)?;
            if b == b']' && !first {
                i += 1;
                break;
            }
            first = false;
            let (lo, next) = if b == b'\\' {
                (*pat.get(i + 1)?, i + 2)
            } else {
                (b, i + 1)
            };
            if pat.get(next) == Some(&b'-') && pat.get(next + 1).is_some_and(|&h| h != b']') {
                let (hi, after) = if pat[next + 1] == b'\\' {
                    (*pat.get(next + 2)?, next + 3)
                } else {
                    (pat[next + 1], next + 2)
                };
                if lo <= c && c <= hi {
                    matched = true;
                }
                i = after;
            } else {
                if lo == c {
                    matched = true;
                }
                i = next;
            }
        }
        Some((matched != negate && c != b'/', i))
    }
    fn go(pat: &[u8], text: &[u8], zero_dirs: bool) -> bool {
        let (mut p, mut t) = (0, 0);
        while p < pat.len() {
            match pat[p] {
                b'*' => {
                    let double = pat.get(p + 1) == Some(&b'*');
                    let mut rest = p + 1;
                    while rest < pat.len() && pat[rest] == b'*' {
                        rest += 1;
                    }
                    if rest == pat.len() {
                        return double || !text[t..].contains(&b'/');
                    }
                    // A leading `**/` also matches no directory at all (`**/z` matches
                    // `z`), as in rsync; elsewhere (`a/**/z`) it needs one.
                    if double
                        && zero_dirs
                        && p == 0
                        && pat[rest] == b'/'
                        && go(&pat[rest + 1..], &text[t..], zero_dirs)
                    {
                        return true;
                    }
                    let mut k = t;
                    loop {
                        if go(&pat[rest..], &text[k..], zero_dirs) {
                            return true;
                        }
                        if k == text.len() || (!double && text[k] == b'/') {
                            return false;
                        }
                        k += 1;
                    }
                }
                b'?' => {
                    if t == text.len() || text[t] == b'/' {
                        return false;
                    }
                    p += 1;
                    t += 1;
                }
                b'[' => {
                    let Some(&c) = text.get(t) else {
                        return false;
                    };
                    match class(&pat[p + 1..], c) {
                        Some((true, n)) => {
                            p += 1 + n;
                            t += 1;
                        }
                        Some((false, _)) => return false,
                        // No closing bracket: a literal '['.
                        None => {
                            if c != b'[' {
                                return false;
                            }
                            p += 1;
                            t += 1;
                        }
                    }
                }
                b'\\' if p + 1 < pat.len() => {
                    if text.get(t) != Some(&pat[p + 1]) {
                        return false;
                    }
                    p += 2;
                    t += 1;
                }
                c => {
                    if text.get(t) != Some(&c) {
                        return false;
                    }
                    p += 1;
                    t += 1;
                }
            }
        }
        t == text.len()
    }
    go(pat, text, zero_dirs)
}

/// The longest line a `--files-from` list may hold, in bytes (Linux's `PATH_MAX`).
pub const MAX_LIST_LINE: usize = 4096;

/// `--files-from`'s paths, normalised (components joined by `/`), sorted and
/// deduplicated, all in one buffer: memory linear in the list, with no per-path
/// allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Listed {
    bytes: Vec<u8>,
    /// Each path's start and end in `bytes`, in byte order of the paths.
    spans: Vec<(u32, u32)>,
}

impl Listed {
    fn get(&self, i: usize) -> &[u8] {
        let (s, e) = self.spans[i];
        &self.bytes[s as usize..e as usize]
    }

    /// The index of the first path not below `key` in byte order.
    fn lower_bound(&self, key: &[u8]) -> usize {
        self.spans
            .partition_point(|&(s, e)| &self.bytes[s as usize..e as usize] < key)
    }

    fn contains(&self, path: &[u8]) -> bool {
        let i = self.lower_bound(path);
        i < self.spans.len() && self.get(i) == path
    }

    /// Whether `path` or a directory above it is listed (the root, `""`, is above all).
    fn covers(&self, path: &[u8]) -> bool {
        self.contains(b"")
            || self.contains(path)
            || path
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'/')
                .any(|(i, _)| self.contains(&path[..i]))
    }

    /// Whether a listed path lies below `path` (`path` leads to it). The paths that
    /// start with `path/` are contiguous in byte order, from the first not below it.
    fn leads_to(&self, path: &[u8]) -> bool {
        if path.is_empty() {
            return false;
        }
        let mut key = Vec::with_capacity(path.len() + 1);
        key.extend_from_slice(path);
        key.push(b'/');
        let i = self.lower_bound(&key);
        i < self.spans.len() && self.get(i).starts_with(&key)
    }
}

/// The filters of one transfer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    rules: Vec<Rule>,
    /// `--files-from`: the listed paths.
    listed: Option<Listed>,
}

impl Filter {
    /// No filtering.
    pub fn none() -> Self {
        Filter::default()
    }

    /// Whether the filter passes everything.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.listed.is_none()
    }

    /// Adds a rule (after the ones already there: the first match wins).
    pub fn push(&mut self, rule: Rule) {
        self.rules.push(rule);
    }

    /// Sets `--files-from`'s list from the file's contents. A line that leaves the
    /// source (`..`) or is longer than [`MAX_LIST_LINE`] refuses the list.
    pub fn set_files_from(&mut self, list: &[u8]) -> Result<(), String> {
        let too_large = || format!("--files-from: a list of {} bytes is too large", list.len());
        let offset = |n: usize| u32::try_from(n).map_err(|_| too_large());
        let mut bytes = Vec::new();
        let mut spans = Vec::new();
        for (n, line) in list.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() || line.starts_with(b"#") || line.starts_with(b";") {
                continue;
            }
            if line.len() > MAX_LIST_LINE {
                return Err(format!(
                    "--files-from: line {} has {} bytes, more than a path may ({MAX_LIST_LINE})",
                    n + 1,
                    line.len()
                ));
            }
            let start = bytes.len();
            for c in line.split(|&b| b == b'/') {
                match c {
                    b"" | b"." => {}
                    b".." => {
                        return Err(format!(
                            "--files-from: {:?} leaves the source ('..')",
                            String::from_utf8_lossy(line)
                        ));
                    }
                    c => {
                        if bytes.len() > start {
                            bytes.push(b'/');
                        }
                        bytes.extend_from_slice(c);
                    }
                }
            }
            // An empty path is the source root itself: everything.
            spans.push((offset(start)?, offset(bytes.len())?));
        }
        spans.sort_unstable_by(|&(a, b), &(c, d)| {
            bytes[a as usize..b as usize].cmp(&bytes[c as usize..d as usize])
        });
        spans.dedup_by(|&mut (a, b), &mut (c, d)| {
            bytes[a as usize..b as usize] == bytes[c as usize..d as usize]
        });
        self.listed = Some(Listed { bytes, spans });
        Ok(())
    }

    /// Whether `--files-from` excludes `path` whatever its kind: not listed, not
    /// below a listed path, not leading to one. Lets the walk skip such names without
    /// a stat; [`Filter::admits`] decides the rest.
    pub fn listed_rules_out(&self, path: &[u8]) -> bool {
        let Some(listed) = &self.listed else {
            return false;
        };
        !listed.covers(path) && !listed.leads_to(path)
    }

    /// Whether the entry at `path` (relative to the source root, components joined by
    /// `/`) is sent; for a directory, `false` also means "not descended into". The
    /// walk asks for every entry whose parent was sent, parents first.
    pub fn admits(&self, path: &[u8], is_dir: bool) -> bool {
        if let Some(listed) = &self.listed
            && !(listed.covers(path) || is_dir && listed.leads_to(path))
        {
            return false;
        }
        for r in &self.rules {
            if r.matches(path, is_dir) {
                return r.action == Action::Include;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        let cases: &[(&str, &str, bool)] = &[
            ("*.o", "a.o", true),
            ("*.o", "a/b.o", false),
            ("a?c", "abc", true),
            ("a?c", "a/c", false),
            ("**", "a/b/c", true),
            ("a/**/z", "a/b/c/z", true),
            ("a/**/z", "a/z", false),
            ("**/z", "z", true),
            ("a**/z", "a/z", true),
            ("a/**", "a/b", true),
            ("[ab]x", "bx", true),
            ("[!ab]x", "bx", false),
            ("[a-c]x", "cx", true),
            ("[a-c]x", "dx", false),
            ("\\*x", "*x", true),
            ("\\*x", "ax", false),
            ("foo", "foo", true),
            ("foo", "foobar", false),
            ("*", "", true),
            ("*bar", "foo/bar", false),
        ];
        for (p, t, want) in cases {
            assert_eq!(
                wildmatch(p.as_bytes(), t.as_bytes()),
                *want,
                "{p:?} against {t:?}"
            );
        }
    }

    /// (rules, path, is_dir, admitted), from rsync's documented semantics (man
    /// rsync, "FILTER RULES" / "INCLUDE/EXCLUDE PATTERN RULES").
    #[test]
    fn rsync_rules() {
        fn ex(p: &'static str) -> (&'static str, &'static str) {
            ("-", p)
        }
        fn inc(p: &'static str) -> (&'static str, &'static str) {
            ("+", p)
        }
        #[allow(clippy::type_complexity)]
        let cases: &[(&[(&str, &str)], &str, bool, bool)] = &[
            // Unanchored, no slash: the last component at any depth.
            (&[ex("*.o")], "a.o", false, false),
            (&[ex("*.o")], "d/e/a.o", false, false),
            (&[ex("*.o")], "a.c", false, true),
            (&[ex("foo")], "x/foo", true, false),
            (&[ex("foo")], "foo/bar", false, true),
            // Anchored: only at the root of the transfer.
            (&[ex("/foo")], "foo", false, false),
            (&[ex("/foo")], "x/foo", false, true),
            // A slash inside: matches the end of the path at a component boundary.
            (&[ex("a/b")], "a/b", false, false),
            (&[ex("a/b")], "x/a/b", false, false),
            (&[ex("a/b")], "xa/b", false, true),
            (&[ex("/a/b")], "x/a/b", false, true),
            (&[ex("a/*.c")], "a/x/y.c", false, true),
            (&[ex("a/*.c")], "z/a/y.c", false, false),
            // `**` crosses `/`.
            (&[ex("a/**/z")], "a/b/c/z", false, false),
            (&[ex("/a/**")], "a/b/c", false, false),
            (&[ex("/a/**")], "a", true, true),
            (&[ex("**/z")], "a/b/z", false, false),
            (&[ex("**/z")], "z", false, false),
            (&[ex("a/**/z")], "a/z", false, true),
            (&[ex("a/**/z")], "q/a/z", false, true),
            (&[ex("a/**/z")], "q/a/b/z", false, false),
            (&[ex("a/**")], "q/a/b", false, false),
            (&[ex("sub/***")], "sub", true, false),
            (&[ex("sub/***")], "sub/x/y", false, false),
            (&[ex("sub/***")], "subx", true, true),
            // A trailing slash: directories only.
            (&[ex("tmp/")], "tmp", true, false),
            (&[ex("tmp/")], "tmp", false, true),
            (&[ex("tmp/")], "a/tmp", true, false),
            // First match wins.
            (&[inc("keep.o"), ex("*.o")], "keep.o", false, true),
            (&[inc("keep.o"), ex("*.o")], "d/keep.o", false, true),
            (&[ex("*.o"), inc("keep.o")], "keep.o", false, false),
            (&[inc("*/"), inc("*.c"), ex("*")], "d", true, true),
            (&[inc("*/"), inc("*.c"), ex("*")], "d/x.c", false, true),
            (&[inc("*/"), inc("*.c"), ex("*")], "d/x.h", false, false),
            // The classic pitfall: `*` excludes directories too.
            (&[inc("*.c"), ex("*")], "d", true, false),
        ];
        for (rules, path, is_dir, want) in cases {
            let mut f = Filter::none();
            for (a, p) in *rules {
                let a = if *a == "+" {
                    Action::Include
                } else {
                    Action::Exclude
                };
                f.push(Rule::new(a, p.as_bytes()).unwrap());
            }
            assert_eq!(
                f.admits(path.as_bytes(), *is_dir),
                *want,
                "{rules:?} on {path:?} (dir: {is_dir})"
            );
        }
    }

    #[test]
    fn files_from() {
        let mut f = Filter::none();
        f.set_files_from(b"# list\n./a/b/c.txt\n\nd\n/e.txt\r\n")
            .unwrap();
        assert!(f.admits(b"a", true));
        assert!(f.admits(b"a/b", true));
        assert!(f.admits(b"a/b/c.txt", false));
        assert!(!f.admits(b"a/b/other", false));
        assert!(!f.admits(b"a/x", true));
        assert!(f.admits(b"d", true));
        assert!(f.admits(b"d/any/thing", false), "below a listed directory");
        assert!(f.admits(b"e.txt", false));
        assert!(!f.admits(b"f", false));
        assert!(!f.admits(b"a", false), "an ancestor must be a directory");
        assert!(f.set_files_from(b"../x\n").is_err());
        let mut f = Filter::none();
        f.set_files_from(b"a/b/c\n").unwrap();
        assert!(!f.listed_rules_out(b"a") && !f.listed_rules_out(b"a/b"));
        assert!(!f.listed_rules_out(b"a/b/c") && !f.listed_rules_out(b"a/b/c/d"));
        assert!(f.listed_rules_out(b"a/x") && f.listed_rules_out(b"z"));
        assert!(!Filter::none().listed_rules_out(b"z"));
        // Rules apply to listed paths too.
        f.push(Rule::new(Action::Exclude, b"*.txt").unwrap());
        assert!(!f.admits(b"e.txt", false));
    }

    /// Names that sort around `/` (`-` before it, `0` after it) neither hide nor fake
    /// a path below a directory; duplicates and the root line behave.
    #[test]
    fn files_from_prefixes_at_component_boundaries() {
        let mut f = Filter::none();
        f.set_files_from(b"a-c\na/b\na0/x\na/b\n").unwrap();
        assert!(f.admits(b"a", true), "leads to a/b");
        assert!(f.admits(b"a0", true) && !f.admits(b"a0/y", false));
        assert!(!f.admits(b"a-", true) && !f.admits(b"a/b0", false));
        assert!(f.admits(b"a-c", false) && f.admits(b"a/b/deep/er", false));
        assert!(f.listed_rules_out(b"a-") && !f.listed_rules_out(b"a0/x"));
        assert!(
            !f.admits(b"", true),
            "the root leads nowhere: it is never asked"
        );
        let mut all = Filter::none();
        all.set_files_from(b"x\n./\n").unwrap();
        assert!(
            all.admits(b"anything/at/all", false),
            "the root line lists everything"
        );
    }

    /// A line may be as long as a path, no longer; a list leaving the source is refused
    /// whatever comes before.
    #[test]
    fn files_from_lines_are_bounded() {
        let long = "a/".repeat(MAX_LIST_LINE / 2);
        let mut f = Filter::none();
        f.set_files_from(&long.as_bytes()[..MAX_LIST_LINE]).unwrap();
        assert!(f.admits(&long.as_bytes()[..MAX_LIST_LINE - 1], false));
        let e = f
            .set_files_from(format!("ok\n{long}x\n").as_bytes())
            .unwrap_err();
        assert!(e.contains("line 2") && e.contains("4096"), "{e}");
        assert!(
            f.set_files_from(b"ok\na/../../b\n")
                .unwrap_err()
                .contains("leaves")
        );
    }
}
