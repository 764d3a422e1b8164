//! The REST API over loopback (plain HTTP, and TLS with a server identity) in front of
//! a job service and two real servers: submit → done, list and pages, owners and
//! admins, refusals (no token, a wrong token, another user's job, bad input), cancel.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Lab, Running, bytes, get_all, start_api};
use dmover_jobs::client::{ApiClient, ClientError};
use dmover_jobs::model::State;
use tokio_util::sync::CancellationToken;

fn client(lab: &Lab, url: &str, token: Option<&str>) -> ApiClient {
    let kh = lab.dir.path().join("client_known_hosts");
    ApiClient::new(url, token.map(str::to_string), kh).unwrap()
}

fn api_error(e: ClientError) -> (u16, String, String) {
    match e {
        ClientError::Api {
            status,
            code,
            message,
        } => (status, code, message),
        e => panic!("not an API error: {e}"),
    }
}

#[test]
fn a_submitted_job_is_done_and_only_its_owner_and_admins_see_it() {
    let lab = Lab::new(None);
    std::fs::write(lab.a_root.join("data/f"), bytes(3, 200_000)).unwrap();
    let svc = Running::start(&lab.db(), lab.runner_config());
    let url = start_api(&svc, None);
    let (alice, bob, root) = (
        client(&lab, &url, Some("alice-token")),
        client(&lab, &url, Some("bob-token")),
        client(&lab, &url, Some("root-token")),
    );
    let job = svc
        .rt
        .block_on(alice.submit(&lab.spec(&["data/f"], "in/")))
        .unwrap();
    assert_eq!((job.owner.as_str(), job.state), ("alice", State::Queued));
    let done = svc.wait_end(job.id);
    assert_eq!(done.state, State::Done, "{done:#?}");
    assert_eq!(
        std::fs::read(lab.b_root.join("in/f")).unwrap(),
        bytes(3, 200_000)
    );
    let rt = &svc.rt;
    let seen = rt.block_on(alice.job(job.id)).unwrap();
    assert_eq!((seen.state, seen.bytes), (State::Done, 200_000));
    // Bob cannot see, cancel or retry it; root (an admin) can see it.
    for r in [
        rt.block_on(bob.job(job.id)),
        rt.block_on(bob.cancel(job.id)),
        rt.block_on(bob.retry(job.id)),
    ] {
        let (status, code, _) = api_error(r.unwrap_err());
        assert_eq!((status, code.as_str()), (404, "not_found"));
    }
    assert!(rt.block_on(bob.list(10, None)).unwrap().jobs.is_empty());
    assert_eq!(rt.block_on(root.job(job.id)).unwrap().owner, "alice");
    assert_eq!(rt.block_on(root.list(10, None)).unwrap().jobs.len(), 1);
    // A done job is neither cancelled nor retried.
    let (status, code, m) = api_error(rt.block_on(alice.cancel(job.id)).unwrap_err());
    assert_eq!((status, code.as_str()), (409, "conflict"), "{m}");
    let (status, _, _) = api_error(rt.block_on(alice.retry(job.id)).unwrap_err());
    assert_eq!(status, 409);
    svc.stop();
}

#[test]
fn requests_without_a_valid_token_are_refused_and_change_nothing() {
    let lab = Lab::new(None);
    let svc = Running::start(&lab.db(), lab.runner_config());
    let url = start_api(&svc, None);
    let spec = serde_json::to_value(lab.spec(&["data/f"], "in/")).unwrap();
    let rt = &svc.rt;
    for token in [None, Some("wrong"), Some("mon-token")] {
        let c = client(&lab, &url, token);
        let (status, body) = rt
            .block_on(c.request("POST", "/api/v1/jobs", Some(&spec)))
            .unwrap();
        assert_eq!(status, 401, "{token:?}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        let (status, _) = rt.block_on(c.request("GET", "/api/v1/jobs", None)).unwrap();
        assert_eq!(status, 401);
    }
    let page = rt
        .block_on(client(&lab, &url, Some("root-token")).list(10, None))
        .unwrap();
    assert!(page.jobs.is_empty(), "nothing was queued");
    svc.stop();
}

#[test]
fn bad_input_gets_a_clear_json_error() {
    let lab = Lab::new(None);
    let svc = Running::start(&lab.db(), lab.runner_config());
    let url = start_api(&svc, None);
    let alice = client(&lab, &url, Some("alice-token"));
    let rt = &svc.rt;
    let post = |path: &str, body: serde_json::Value| {
        rt.block_on(alice.request("POST", path, Some(&body)))
            .unwrap()
    };
    let local = serde_json::json!({"sources": ["/etc/passwd"], "destination": format!("dmover://{}/in/", lab.b)});
    let (s, b) = post("/api/v1/jobs", local);
    assert_eq!(s, 400, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is a local path"),
        "{b}"
    );
    let (s, b) = post("/api/v1/jobs", serde_json::json!({"sources": "x"}));
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{b}"
    );
    let mixed = serde_json::json!({"sources": [format!("dmover://{}/a", lab.a), format!("dmover://{}/b", lab.b)], "destination": format!("dmover://{}/in/", lab.b)});
    let (s, b) = post("/api/v1/jobs", mixed);
    assert_eq!(s, 400);
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("same server"),
        "{b}"
    );
    for (path, want) in [
        ("/api/v1/jobs/abc", 400),
        ("/api/v1/jobs/77", 404),
        ("/api/v1/jobs?limit=0", 400),
        ("/api/v1/jobs?colour=red", 400),
        ("/api/v2/nothing", 404),
    ] {
        let (s, b) = rt.block_on(alice.request("GET", path, None)).unwrap();
        assert_eq!(s, want, "{path}: {b}");
        assert!(b["error"]["message"].is_string(), "{path}: {b}");
    }
    svc.stop();
}

#[test]
fn pages_go_newest_first_and_end() {
    let lab = Lab::new(None);
    // No runner: the jobs stay queued.
    let store: Arc<dyn dmover_jobs::store::JobStore> =
        Arc::new(dmover_jobs::store::SqliteStore::open(&lab.db()).unwrap());
    let service = dmover_jobs::runner::Service::new(store, lab.runner_config());
    let svc = Running {
        service,
        rt: tokio::runtime::Runtime::new().unwrap(),
        stop: CancellationToken::new(),
    };
    let url = start_api(&svc, None);
    let alice = client(&lab, &url, Some("alice-token"));
    for i in 0..5 {
        let spec = lab.spec(&[&format!("data/{i}")], "in/");
        svc.rt.block_on(alice.submit(&spec)).unwrap();
    }
    let first = svc.rt.block_on(alice.list(2, None)).unwrap();
    let ids: Vec<_> = first.jobs.iter().map(|j| j.id).collect();
    assert_eq!((ids, first.next), (vec![5, 4], Some(4)));
    let second = svc.rt.block_on(alice.list(2, Some(4))).unwrap();
    assert_eq!(second.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), [3, 2]);
    let last = svc.rt.block_on(alice.list(2, Some(2))).unwrap();
    assert_eq!((last.jobs.len(), last.next), (1, None));
    // Cancelling a queued job ends it at once.
    let c = svc.rt.block_on(alice.cancel(1)).unwrap();
    assert_eq!(c.state, State::Cancelled);
    svc.stop();
}

#[test]
fn over_tls_a_running_job_is_cancelled() {
    let lab = Lab::new(Some(Duration::from_millis(50)));
    std::fs::write(lab.a_root.join("data/big"), bytes(5, 6 << 20)).unwrap();
    let svc = Running::start(&lab.db(), lab.runner_config());
    let identity = dmover_net::tls::ServerIdentity::ephemeral().unwrap();
    let url = start_api(&svc, Some(identity.acceptor().unwrap()));
    assert!(url.starts_with("https://"));
    let alice = client(&lab, &url, Some("alice-token"));
    let job = svc
        .rt
        .block_on(alice.submit(&lab.spec(&["data/big"], "in/")))
        .unwrap();
    svc.wait(job.id, "data moving", |j| j.bytes > 0);
    svc.rt.block_on(alice.cancel(job.id)).unwrap();
    let j = svc.wait_end(job.id);
    assert_eq!(j.state, State::Cancelled, "{j:#?}");
    assert_eq!(
        svc.rt.block_on(alice.job(job.id)).unwrap().state,
        State::Cancelled
    );
    assert!(!lab.b_root.join("in/big").exists());
    // The service's key was pinned on first use.
    let pinned = std::fs::read_to_string(lab.dir.path().join("client_known_hosts")).unwrap();
    assert!(pinned.contains(identity.fingerprint()), "{pinned}");
    // Plain HTTP to the TLS port is no answer.
    let plain = client(
        &lab,
        &url.replace("https://", "http://"),
        Some("alice-token"),
    );
    assert!(svc.rt.block_on(plain.job(job.id)).is_err());
    svc.stop();
}

/// A job's event stream: its record now, then at each change (bytes growing while it
/// runs), ending with the line of the ended job; at once for an ended job; another
/// user's job is not found.
#[test]
fn a_jobs_events_follow_it_to_its_end() {
    // About 2.5 s: a copy between two servers hears its counters once a second.
    let lab = Lab::new(Some(Duration::from_millis(50)));
    std::fs::write(lab.a_root.join("data/big"), bytes(5, 6 << 20)).unwrap();
    let svc = Running::start(&lab.db(), lab.runner_config());
    let url = start_api(&svc, None);
    let addr = url.strip_prefix("http://").unwrap().to_string();
    let alice = client(&lab, &url, Some("alice-token"));
    let job = svc
        .rt
        .block_on(alice.submit(&lab.spec(&["data/big"], "in/")))
        .unwrap();
    let path = format!("/api/v1/jobs/{}/events", job.id);
    let (status, headers, body) = get_all(&addr, &path, "alice-token");
    assert_eq!(status, 200);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v == "application/x-ndjson"),
        "{headers:?}"
    );
    let text = String::from_utf8(body).unwrap();
    assert!(text.ends_with('\n'), "{text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let jobs: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["type"] == "job")
        .map(|l| &l["job"])
        .collect();
    assert!(jobs.len() >= 3, "{text}");
    assert_eq!(jobs.last().unwrap()["state"], "done", "{text}");
    assert_eq!(jobs.last().unwrap()["bytes"], 6 << 20);
    assert!(jobs[..jobs.len() - 1].iter().all(|j| j["state"] != "done"));
    let bytes_seen: Vec<u64> = jobs.iter().map(|j| j["bytes"].as_u64().unwrap()).collect();
    assert!(
        bytes_seen.windows(2).all(|w| w[0] <= w[1]),
        "{bytes_seen:?}"
    );
    assert!(
        bytes_seen.iter().any(|&b| b > 0 && b < 6 << 20),
        "no line while it ran: {bytes_seen:?}"
    );
    // Ended: one line, the job as it is.
    let (status, _, body) = get_all(&addr, &path, "alice-token");
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("\"state\":\"done\""), "{text}");
    // Not bob's; no token.
    assert_eq!(get_all(&addr, &path, "bob-token").0, 404);
    assert_eq!(get_all(&addr, &path, "nobody").0, 401);
    svc.stop();
}

/// The caps answer `limit`: 413 for a job naming more sources than `max_sources`,
/// 429 for a user at `max_unfinished_per_user`; 400 for a priority out of 1 to 5.
/// The job's priority and link are in its JSON.
#[test]
fn caps_are_refused_with_limit_and_priorities_are_shown() {
    let lab = Lab::new(None);
    // No runner: the jobs stay queued.
    let store: Arc<dyn dmover_jobs::store::JobStore> = Arc::new(
        dmover_jobs::store::SqliteStore::open(&lab.db())
            .unwrap()
            .with_policy(dmover_jobs::store::Policy {
                link_concurrency: 4,
                max_unfinished_per_user: Some(2),
            }),
    );
    let mut cfg = lab.runner_config();
    cfg.max_sources = 2;
    let service = dmover_jobs::runner::Service::new(store, cfg);
    let svc = Running {
        service,
        rt: tokio::runtime::Runtime::new().unwrap(),
        stop: CancellationToken::new(),
    };
    let url = start_api(&svc, None);
    let (alice, bob) = (
        client(&lab, &url, Some("alice-token")),
        client(&lab, &url, Some("bob-token")),
    );
    let mut spec = lab.spec(&["data/a"], "in/");
    spec.options.priority = Some(5);
    let j = svc.rt.block_on(alice.submit(&spec)).unwrap();
    assert_eq!(j.priority, 5);
    assert_eq!(j.link, format!("{} -> {}", lab.a, lab.b));
    let (s, b) = svc
        .rt
        .block_on(alice.request("GET", &format!("/api/v1/jobs/{}", j.id), None))
        .unwrap();
    assert_eq!(s, 200);
    assert_eq!(
        (
            b["priority"].as_u64(),
            b["spec"]["options"]["priority"].as_u64()
        ),
        (Some(5), Some(5)),
        "{b}"
    );
    spec.options.priority = Some(6);
    let (s, code, m) = api_error(svc.rt.block_on(alice.submit(&spec)).unwrap_err());
    assert_eq!((s, code.as_str()), (400, "bad_request"), "{m}");
    assert!(m.contains("priority: 6 is not between 1 and 5"), "{m}");
    let three = lab.spec(&["data/a", "data/b", "data/c"], "in/");
    let (s, code, m) = api_error(svc.rt.block_on(alice.submit(&three)).unwrap_err());
    assert_eq!((s, code.as_str()), (413, "limit"), "{m}");
    assert!(m.contains("max_sources = 2"), "{m}");
    svc.rt
        .block_on(alice.submit(&lab.spec(&["data/b"], "in/")))
        .unwrap();
    let (s, code, m) = api_error(
        svc.rt
            .block_on(alice.submit(&lab.spec(&["data/c"], "in/")))
            .unwrap_err(),
    );
    assert_eq!((s, code.as_str()), (429, "limit"), "{m}");
    assert!(m.contains("max_unfinished_per_user = 2"), "{m}");
    // Bob is counted apart; a cancelled job of alice's frees a place.
    svc.rt
        .block_on(bob.submit(&lab.spec(&["data/c"], "in/")))
        .unwrap();
    svc.rt.block_on(alice.cancel(j.id)).unwrap();
    svc.rt
        .block_on(alice.submit(&lab.spec(&["data/c"], "in/")))
        .unwrap();
    svc.stop();
}
