//! The library API's example (`examples/push.rs`) run as a test: an in-process server
//! on loopback, a tree pushed through `dmover_core::transfer`, its events and report.

#[path = "../examples/push.rs"]
mod example;

use dmover_core::transfer::Event;

#[test]
fn the_example_pushes_a_tree_and_reports_it() {
    let mut lines = Vec::new();
    let seen = example::push_example(&mut |l| lines.push(l)).expect("the example runs");
    let r = &seen.finished.report;
    assert_eq!(seen.identical, 5);
    assert_eq!(r.summary.files, 5, "{r:?}");
    assert_eq!(r.totals.files, 5);
    assert_eq!(r.attempts, 1);
    assert!(seen.finished.complete());
    // Every file with data is named once, and the last counters are complete.
    let mut done: Vec<String> = seen
        .events
        .iter()
        .filter_map(|e| match e {
            Event::FilesDone { paths, .. } => Some(paths.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    done.sort();
    assert_eq!(
        done,
        [
            "run1/a.dat",
            "run1/b.dat",
            "run1/big.bin",
            "run1/logs/x.log"
        ]
    );
    let last = seen
        .events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Progress(s) => Some(*s),
            _ => None,
        })
        .expect("a last progress event");
    assert_eq!(last.total, r.totals.bytes);
    assert_eq!(last.done(), last.total);
    assert_eq!((last.files, last.total_files), (4, 4));
    assert!(lines.iter().any(|l| l.starts_with("server on 127.0.0.1:")));
}
