//! Webhooks (issue 41, item 6): a job that names a URL (`options.notify`) has its
//! record POSTed there each time it ends, retried while the receiver may still take
//! it, remembered across a stop of the service, refused at submission outside the
//! allow-list. A real HTTP receiver (axum) on loopback answers as each test scripts.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use common::{Lab, Running, bytes};
use dmover_jobs::model::{JobOptions, JobSpec, State, WebhookState};
use dmover_jobs::runner::SubmitError;
use dmover_jobs::webhook::Webhooks;

/// What the receiver got, and what it answers next.
#[derive(Default)]
struct Inbox {
    /// `(X-Dmover-Job, Content-Type, body)` of each POST, in order.
    posts: Vec<(String, String, serde_json::Value)>,
    /// The statuses of the next answers, in order; then 200.
    answers: Vec<u16>,
}

/// A receiver on `lab`'s runtime at `http://ADDR/hooks/...`; its address.
fn receiver(lab: &Lab, inbox: Arc<Mutex<Inbox>>) -> String {
    let app = axum::Router::new().route(
        "/hooks/{*rest}",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let inbox = inbox.clone();
            async move {
                let h = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                let mut i = inbox.lock().unwrap();
                i.posts.push((h("x-dmover-job"), h("content-type"), json));
                let status = if i.answers.is_empty() {
                    200
                } else {
                    i.answers.remove(0)
                };
                StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    lab.rt.block_on(async move {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(l, app).await });
        addr
    })
}

/// Webhooks allowed under `http://ADDR/hooks/`, retried quickly.
fn allowed(addr: &str) -> Webhooks {
    let mut w = Webhooks::new(&[format!("http://{addr}/hooks/")], None).unwrap();
    w.first_wait = Duration::from_millis(20);
    w
}

fn notifying(lab: &Lab, url: String) -> JobSpec {
    JobSpec {
        options: JobOptions {
            notify: Some(url),
            ..JobOptions::default()
        },
        ..lab.spec(&["data/f"], "in/")
    }
}

#[test]
fn an_ended_job_is_posted_to_its_webhook_and_retried_until_it_is_taken() {
    let lab = Lab::new(None);
    std::fs::write(lab.a_root.join("data/f"), bytes(1, 10_000)).unwrap();
    let inbox = Arc::new(Mutex::new(Inbox {
        answers: vec![500, 503],
        ..Inbox::default()
    }));
    let addr = receiver(&lab, inbox.clone());
    let mut cfg = lab.runner_config();
    cfg.webhooks = allowed(&addr);
    let svc = Running::start(&lab.db(), cfg);

    // Outside the allow-list: refused at submission, nothing queued.
    for bad in [
        format!("http://{addr}/elsewhere"),
        "http://127.0.0.1:1/hooks/x".to_string(),
        "file:///etc/passwd".to_string(),
    ] {
        let e = svc
            .rt
            .block_on(svc.service.submit("alice", notifying(&lab, bad.clone())))
            .unwrap_err();
        assert!(matches!(e, SubmitError::Invalid(_)), "{bad}: {e:?}");
        assert!(e.to_string().starts_with("notify: "), "{e}");
    }

    let url = format!("http://{addr}/hooks/job?site=test");
    let job = svc
        .rt
        .block_on(svc.service.submit("alice", notifying(&lab, url)))
        .unwrap();
    assert_eq!(job.webhook, None, "not ended: no webhook yet");
    let j = svc.wait(job.id, "the webhook's delivery", |j| {
        j.webhook == Some(WebhookState::Delivered)
    });
    assert_eq!(j.state, State::Done, "{j:#?}");
    assert_eq!(j.webhook_error, None);
    let posts = std::mem::take(&mut inbox.lock().unwrap().posts);
    assert_eq!(posts.len(), 3, "two refusals, then taken: {posts:#?}");
    for (id, ctype, body) in &posts {
        assert_eq!(id, &job.id.to_string());
        assert_eq!(ctype, "application/json");
        assert_eq!(body["id"], job.id);
        assert_eq!(body["state"], "done", "{body}");
        assert_eq!(body["bytes"], 10_000, "{body}");
        assert_eq!(body["owner"], "alice");
    }
    assert_eq!(
        std::fs::read(lab.b_root.join("in/f")).unwrap(),
        bytes(1, 10_000)
    );
    // Delivered once: no more posts come.
    std::thread::sleep(Duration::from_millis(200));
    assert!(inbox.lock().unwrap().posts.is_empty());
    svc.stop();
}

#[test]
fn a_receiver_that_will_not_take_it_leaves_the_webhook_failed_with_why() {
    let lab = Lab::new(None);
    std::fs::write(lab.a_root.join("data/f"), bytes(2, 1000)).unwrap();
    // A 404 is final: one attempt. Five 500s: given up after five.
    let inbox = Arc::new(Mutex::new(Inbox {
        answers: vec![404, 500, 500, 500, 500, 500],
        ..Inbox::default()
    }));
    let addr = receiver(&lab, inbox.clone());
    let mut cfg = lab.runner_config();
    cfg.webhooks = allowed(&addr);
    let svc = Running::start(&lab.db(), cfg);
    for (expect, posts) in [("HTTP 404", 1), ("HTTP 500 (5 attempts)", 5)] {
        let job = svc
            .rt
            .block_on(
                svc.service
                    .submit("alice", notifying(&lab, format!("http://{addr}/hooks/x"))),
            )
            .unwrap();
        let j = svc.wait(job.id, "the webhook's end", |j| {
            j.webhook == Some(WebhookState::Failed)
        });
        let why = j.webhook_error.as_deref().unwrap();
        assert!(why.contains(expect), "{why}");
        assert_eq!(j.state, State::Done, "the job itself is done: {j:#?}");
        assert_eq!(
            std::mem::take(&mut inbox.lock().unwrap().posts).len(),
            posts,
            "{expect}"
        );
    }
    svc.stop();
}

/// A cancelled queued job is an end too; a webhook still pending when the service
/// stops (here: its receiver answering 503) is delivered by the next start.
#[test]
fn a_webhook_pending_at_a_stop_is_delivered_after_the_restart() {
    let lab = Lab::new(None);
    let inbox = Arc::new(Mutex::new(Inbox {
        answers: vec![503; 100],
        ..Inbox::default()
    }));
    let addr = receiver(&lab, inbox.clone());
    let mut cfg = lab.runner_config();
    cfg.webhooks = allowed(&addr);
    // Retries slow enough that the stop comes before the service gives up.
    cfg.webhooks.first_wait = Duration::from_secs(30);
    // Submitted and cancelled before any service runs: the store alone.
    let spec = JobSpec {
        sources: vec![format!("dmover://{}/data/none", lab.a)],
        ..notifying(&lab, format!("http://{addr}/hooks/cancelled"))
    };
    let store = dmover_jobs::store::SqliteStore::open(&lab.db()).unwrap();
    let job = dmover_jobs::store::JobStore::submit(
        &store,
        "bob",
        dmover_jobs::model::JobKind::Copy,
        &spec,
    )
    .unwrap();
    let j = dmover_jobs::store::JobStore::cancel(&store, job.id).unwrap();
    assert_eq!(j.state, State::Cancelled);
    assert_eq!(j.webhook, Some(WebhookState::Pending), "{j:#?}");
    drop(store);

    let svc = Running::start(&lab.db(), cfg.clone());
    // The first attempt comes (503), the next waits 30 s: stop during the wait.
    let t = std::time::Instant::now();
    while inbox.lock().unwrap().posts.is_empty() {
        assert!(t.elapsed() < Duration::from_secs(30), "no delivery came");
        std::thread::sleep(Duration::from_millis(5));
    }
    svc.crash();
    let store = dmover_jobs::store::SqliteStore::open(&lab.db()).unwrap();
    let j = dmover_jobs::store::JobStore::get(&store, job.id).unwrap();
    assert_eq!(j.webhook, Some(WebhookState::Pending), "{j:#?}");
    drop(store);

    inbox.lock().unwrap().answers.clear();
    let svc = Running::start(&lab.db(), cfg);
    let j = svc.wait(job.id, "the delivery after the restart", |j| {
        j.webhook == Some(WebhookState::Delivered)
    });
    assert_eq!(j.state, State::Cancelled);
    let posts = std::mem::take(&mut inbox.lock().unwrap().posts);
    assert_eq!(
        posts.len(),
        2,
        "once before the stop, once after: {posts:#?}"
    );
    assert_eq!(posts[1].2["state"], "cancelled");
    assert_eq!(posts[1].2["owner"], "bob");
    svc.stop();
}
