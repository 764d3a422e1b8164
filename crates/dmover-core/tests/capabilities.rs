//! Third-party capabilities refused for what they are (docs/third-party.md): replayed,
//! expired, made for another dialer, naming another address. Two servers in this
//! process on loopback, a client steering them; nothing is written when refused.

use std::path::Path;
use std::time::Duration;

use dmover_core::client::Client;
use dmover_core::engine::Run;
use dmover_core::server::{Server, ServerConfig};
use dmover_core::session::TransferOptions;
use dmover_proto::capability::Scope;
use dmover_proto::control::{ThirdParty, TpcMode};
use tokio_util::sync::CancellationToken;

/// A server of `root` allowing third-party copies, on a loopback port.
async fn server(root: &Path, ttl: Duration) -> (String, CancellationToken) {
    let mut cfg = ServerConfig::new(root);
    cfg.exports[0].third_party = true;
    cfg.tpc_capability_ttl = ttl;
    let srv = Server::new(cfg).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move { srv.serve(l, s).await });
    (addr, stop)
}

fn client(kh: &Path) -> Client {
    let opts = TransferOptions {
        trust: Some(dmover_net::tls::Trust::KnownHosts(kh.to_path_buf())),
        ..TransferOptions::default()
    };
    Client::new(opts, 1)
}

struct Pair {
    _t: tempfile::TempDir,
    a: String,
    b: String,
    b_root: std::path::PathBuf,
    client: Client,
    stops: [CancellationToken; 2],
}

impl Drop for Pair {
    fn drop(&mut self) {
        for s in &self.stops {
            s.cancel();
        }
    }
}

async fn pair(ttl: Duration) -> Pair {
    let t = tempfile::tempdir().unwrap();
    let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(a_root.join("src")).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    std::fs::write(a_root.join("src/f"), vec![7u8; 100_000]).unwrap();
    let (a, sa) = server(&a_root, ttl).await;
    let (b, sb) = server(&b_root, ttl).await;
    let client = client(&t.path().join("known_hosts"));
    Pair {
        a,
        b,
        b_root,
        client,
        stops: [sa, sb],
        _t: t,
    }
}

fn push_to(p: &Pair, capability: dmover_proto::capability::Capability, b_key: &str) -> ThirdParty {
    ThirdParty {
        mode: TpcMode::Push,
        peer: p.b.clone(),
        peer_key: b_key.to_string(),
        capability,
        paths: vec![b"src".to_vec()],
    }
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_is_used_once() {
    let p = pair(Duration::from_secs(60)).await;
    let a_key = p.client.server_key(&p.a).await.unwrap();
    let b_key = p.client.server_key(&p.b).await.unwrap();
    let scope = Scope::Push {
        dest: b"copy".to_vec(),
    };
    let cap = p
        .client
        .request_capability(&p.b, scope, &a_key)
        .await
        .unwrap();
    let tp = push_to(&p, cap.clone(), &b_key);
    let r = p.client.steer(&p.a, tp.clone(), Run::new()).await.unwrap();
    assert_eq!(r.summary.bytes, 100_000);
    assert_eq!(
        std::fs::read(p.b_root.join("copy/f")).unwrap().len(),
        100_000
    );
    std::fs::remove_dir_all(p.b_root.join("copy")).unwrap();
    // The same capability again: B refuses it, nothing is written.
    let e = p.client.steer(&p.a, tp, Run::new()).await.unwrap_err();
    assert!(e.to_string().contains("already used"), "{e}");
    assert_eq!(entries(&p.b_root), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_capability_is_refused_before_anything_is_dialed() {
    let p = pair(Duration::from_secs(1)).await;
    let a_key = p.client.server_key(&p.a).await.unwrap();
    let b_key = p.client.server_key(&p.b).await.unwrap();
    let scope = Scope::Push {
        dest: b"copy".to_vec(),
    };
    let cap = p
        .client
        .request_capability(&p.b, scope, &a_key)
        .await
        .unwrap();
    // Expiry is in whole seconds: past it for certain.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let e = p
        .client
        .steer(&p.a, push_to(&p, cap, &b_key), Run::new())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("expired"), "{e}");
    assert_eq!(entries(&p.b_root), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_for_another_dialer_or_naming_another_address_is_refused() {
    let p = pair(Duration::from_secs(60)).await;
    let b_key = p.client.server_key(&p.b).await.unwrap();
    let scope = Scope::Push {
        dest: b"copy".to_vec(),
    };
    // Made for a server other than A: A will not use it.
    let other = dmover_net::tls::ServerIdentity::ephemeral().unwrap();
    let cap = p
        .client
        .request_capability(&p.b, scope.clone(), other.fingerprint())
        .await
        .unwrap();
    let e = p
        .client
        .steer(&p.a, push_to(&p, cap, &b_key), Run::new())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is for the server with key"), "{e}");
    // Made for A, but the client names another address for B (an "FTP bounce"): A
    // dials nothing.
    let a_key = p.client.server_key(&p.a).await.unwrap();
    let cap = p
        .client
        .request_capability(&p.b, scope, &a_key)
        .await
        .unwrap();
    let mut tp = push_to(&p, cap, &b_key);
    tp.peer = "127.0.0.1:25".into();
    let e = p.client.steer(&p.a, tp, Run::new()).await.unwrap_err();
    assert!(e.to_string().contains("does not name 127.0.0.1:25"), "{e}");
    // The key the client pinned for B must be the capability's issuer.
    let cap = p
        .client
        .request_capability(
            &p.b,
            Scope::Push {
                dest: b"copy".to_vec(),
            },
            &a_key,
        )
        .await
        .unwrap();
    let e = p
        .client
        .steer(&p.a, push_to(&p, cap, other.fingerprint()), Run::new())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("was issued by"), "{e}");
    assert_eq!(entries(&p.b_root), 0);
}
