//! Third-party capabilities refused for what they are (docs/third-party.md): replayed,
//! expired, made for another dialer, naming another address, issued by a server the
//! dialer does not trust; and a dialer that cannot reach the other server says so in
//! the same words whatever answers there. Two servers in this process on loopback, a
//! client steering them; nothing is written when refused.

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
    server_with(root, |cfg| cfg.tpc_capability_ttl = ttl).await
}

/// [`server`] with `tweak` applied to its configuration.
async fn server_with(
    root: &Path,
    tweak: impl FnOnce(&mut ServerConfig),
) -> (String, CancellationToken) {
    let mut cfg = ServerConfig::new(root);
    cfg.exports[0].third_party = true;
    tweak(&mut cfg);
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
    pair_with(ttl, Default::default()).await
}

/// [`pair`], A injecting `a_faults`.
async fn pair_with(ttl: Duration, a_faults: dmover_core::server::Faults) -> Pair {
    let t = tempfile::tempdir().unwrap();
    let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(a_root.join("src")).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    std::fs::write(a_root.join("src/f"), vec![7u8; 100_000]).unwrap();
    let (a, sa) = {
        let mut cfg = ServerConfig::new(&a_root);
        cfg.exports[0].third_party = true;
        cfg.tpc_capability_ttl = ttl;
        let srv = Server::with_faults(cfg, a_faults).unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move { srv.serve(l, s).await });
        (addr, stop)
    };
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

/// B's capability for A to push into B's `copy`.
async fn push_capability(p: &Pair, a_key: &str) -> dmover_proto::capability::Capability {
    let scope = Scope::Push {
        dest: b"copy".to_vec(),
    };
    p.client
        .request_capability(&p.b, scope, a_key)
        .await
        .unwrap()
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

/// A capability the issuer gave out before it restarted (same key, same address) is
/// refused, though unused and unexpired: the set of used nonces lived in the old
/// process, so the new one accepts only the nonces it issued itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_from_before_the_issuers_restart_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(a_root.join("src")).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    std::fs::write(a_root.join("src/f"), vec![7u8; 1000]).unwrap();
    let (a, stop_a) = server(&a_root, Duration::from_secs(60)).await;
    let b_id = dmover_net::tls::ServerIdentity::ephemeral().unwrap();
    let start_b = |l: tokio::net::TcpListener| {
        let mut cfg = ServerConfig::new(&b_root);
        cfg.exports[0].third_party = true;
        cfg.identity = Some(b_id.clone());
        let srv = Server::new(cfg).unwrap();
        let stop = CancellationToken::new();
        let s = stop.clone();
        let task = tokio::spawn(async move { srv.serve(l, s).await });
        (stop, task)
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = l.local_addr().unwrap().to_string();
    let (stop_b, task) = start_b(l);
    let client = client(&t.path().join("known_hosts"));
    let a_key = client.server_key(&a).await.unwrap();
    let b_key = client.server_key(&b).await.unwrap();
    let scope = Scope::Push {
        dest: b"copy".to_vec(),
    };
    let cap = client.request_capability(&b, scope, &a_key).await.unwrap();
    // B restarts on its address, with its key.
    stop_b.cancel();
    let _ = task.await;
    let mut tries = 0;
    let l = loop {
        match tokio::net::TcpListener::bind(&b).await {
            Ok(l) => break l,
            Err(_) if tries < 100 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("binding {b} again: {e}"),
        }
    };
    let (stop_b, _task) = start_b(l);
    let tp = ThirdParty {
        mode: TpcMode::Push,
        peer: b.clone(),
        peer_key: b_key.clone(),
        capability: cap,
        paths: vec![b"src".to_vec()],
    };
    let e = client.steer(&a, tp.clone(), Run::new()).await.unwrap_err();
    assert!(
        e.to_string().contains("before this server restarted"),
        "{e}"
    );
    assert_eq!(entries(&b_root), 0);
    // A capability the new process issues works.
    let scope = Scope::Push {
        dest: b"copy".to_vec(),
    };
    let cap = client.request_capability(&b, scope, &a_key).await.unwrap();
    let r = client
        .steer(
            &a,
            ThirdParty {
                capability: cap,
                ..tp
            },
            Run::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.summary.bytes, 1000);
    stop_a.cancel();
    stop_b.cancel();
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
    let cap = push_capability(&p, &a_key).await;
    let e = p
        .client
        .steer(&p.a, push_to(&p, cap, other.fingerprint()), Run::new())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("was issued by"), "{e}");
    assert_eq!(entries(&p.b_root), 0);
}

/// A loopback port where a listener waits and is never accepted from: whether
/// anything connected to it shows as a pending connection.
struct Trap(std::net::TcpListener);

impl Trap {
    fn new() -> (Trap, String) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap().to_string();
        (Trap(l), addr)
    }

    /// Whether a connection came (a connect completes in the kernel at once on
    /// loopback, before the dialer's error can reach the client).
    fn dialed(&self) -> bool {
        match self.0.accept() {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Issue 46, item 4: a client that names another address for the issuer in its
/// grant request (a port of its choosing) gets a capability naming the issuer's own
/// address only, and the dialer, asked to dial that port, refuses without a
/// connection attempt. Before, the issuer signed the address the client named and the
/// dialer connected to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issuer_vouches_only_for_its_own_address_and_nothing_else_is_dialed() {
    let p = pair(Duration::from_secs(60)).await;
    let a_key = p.client.server_key(&p.a).await.unwrap();
    let b_key = p.client.server_key(&p.b).await.unwrap();
    let (trap, trap_addr) = Trap::new();
    let scope = Scope::Push {
        dest: b"copy".to_vec(),
    };
    let cap = p
        .client
        .request_capability_naming(&p.b, &trap_addr, scope, &a_key)
        .await
        .unwrap();
    let mut tp = push_to(&p, cap.clone(), &b_key);
    tp.peer = trap_addr.clone();
    let e = p.client.steer(&p.a, tp, Run::new()).await.unwrap_err();
    assert!(!trap.dialed(), "the dialer connected to {trap_addr}: {e}");
    assert!(
        e.to_string()
            .contains(&format!("does not name {trap_addr}")),
        "{e}"
    );
    let g = dmover_proto::capability::Grant::decode(&cap.grant).unwrap();
    assert_eq!(g.addrs, vec![p.b.clone()]);
    assert_eq!(entries(&p.b_root), 0);
    // The same capability at the address B named: the copy runs.
    let r = p
        .client
        .steer(&p.a, push_to(&p, cap, &b_key), Run::new())
        .await
        .unwrap();
    assert_eq!(r.summary.bytes, 100_000);
}

/// A capability made by the client itself (its own key as "issuer", naming a port of
/// its choosing): a dialer whose `tpc_peers` does not name that key refuses it
/// without a connection attempt, while a copy from a server it names runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialer_with_tpc_peers_dials_only_those_servers() {
    let t = tempfile::tempdir().unwrap();
    let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(a_root.join("src")).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    std::fs::write(a_root.join("src/f"), vec![7u8; 100_000]).unwrap();
    let b_id = dmover_net::tls::ServerIdentity::ephemeral().unwrap();
    let b_fp = b_id.fingerprint().to_string();
    let (a, sa) = server_with(&a_root, |c| c.tpc_peers = vec![b_fp.clone()]).await;
    let (b, sb) = server_with(&b_root, |c| c.identity = Some(b_id)).await;
    let p = Pair {
        a,
        b,
        b_root,
        client: client(&t.path().join("known_hosts")),
        stops: [sa, sb],
        _t: t,
    };
    let a_key = p.client.server_key(&p.a).await.unwrap();
    let b_key = p.client.server_key(&p.b).await.unwrap();
    assert_eq!(b_key, b_fp);
    let (trap, trap_addr) = Trap::new();
    let mallory = dmover_net::tls::ServerIdentity::ephemeral().unwrap();
    let cap = minted(&mallory, &a_key, &trap_addr);
    let tp = ThirdParty {
        peer: trap_addr.clone(),
        ..push_to(&p, cap, mallory.fingerprint())
    };
    let e = p.client.steer(&p.a, tp, Run::new()).await.unwrap_err();
    assert!(!trap.dialed(), "the dialer connected to {trap_addr}: {e}");
    assert!(e.to_string().contains("tpc_peers"), "{e}");
    // B is one of A's peers: its capability works.
    let cap = push_capability(&p, &a_key).await;
    let r = p
        .client
        .steer(&p.a, push_to(&p, cap, &b_key), Run::new())
        .await
        .unwrap();
    assert_eq!(r.summary.bytes, 100_000);
}

/// A capability signed with `issuer`'s key for the dialer `dialer`, naming `addr`.
fn minted(
    issuer: &dmover_net::tls::ServerIdentity,
    dialer: &str,
    addr: &str,
) -> dmover_proto::capability::Capability {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let g = dmover_proto::capability::Grant {
        version: dmover_proto::capability::GRANT_VERSION,
        issuer: issuer.fingerprint().to_string(),
        addrs: vec![addr.to_string()],
        dialer: dialer.to_string(),
        user: "anyone".into(),
        scope: Scope::Push {
            dest: b"copy".to_vec(),
        },
        expires: now + 60,
        nonce: [3; 16],
    };
    dmover_net::capability::issue(issuer, &g).unwrap()
}

/// A dialer that cannot reach the other server says so in the same words whatever
/// answers at the address: nothing (connection refused), a listener that never
/// speaks (its TLS handshake times out), or another service (it sends a banner and
/// closes). So steering a server at addresses tells a client nothing of them. The
/// capabilities are the client's own (a dialer without `tpc_peers` trusts the key the
/// client pinned); A's handshake timeout is short so that the silent one ends soon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_is_told_without_its_cause() {
    let t = tempfile::tempdir().unwrap();
    let a_root = t.path().join("a");
    std::fs::create_dir_all(a_root.join("src")).unwrap();
    std::fs::write(a_root.join("src/f"), b"x").unwrap();
    let (a, stop) = server_with(&a_root, |c| c.handshake_timeout = Duration::from_secs(2)).await;
    let client = client(&t.path().join("known_hosts"));
    let a_key = client.server_key(&a).await.unwrap();
    // Refused: a port whose listener is gone.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    // Silent: a listener nobody accepts from (the kernel completes the connect).
    let (silent_trap, silent) = Trap::new();
    // Another service: a banner, then the connection closed.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let banner = other.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        use std::io::Write;
        for c in other.incoming().take(32) {
            let Ok(mut c) = c else { break };
            let _ = c.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
        }
    });
    let mut said = Vec::new();
    for addr in [&closed, &silent, &banner] {
        let mallory = dmover_net::tls::ServerIdentity::ephemeral().unwrap();
        let tp = ThirdParty {
            mode: TpcMode::Push,
            peer: addr.clone(),
            peer_key: mallory.fingerprint().to_string(),
            capability: minted(&mallory, &a_key, addr),
            paths: vec![b"src".to_vec()],
        };
        let started = std::time::Instant::now();
        let e = client.steer(&a, tp, Run::new()).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(20), "{e}");
        let e = e.to_string();
        assert!(e.contains(&format!("could not reach {addr}")), "{e}");
        said.push(e.replace(addr.as_str(), "ADDR"));
    }
    assert!(silent_trap.dialed());
    assert_eq!(said[0], said[1]);
    assert_eq!(said[0], said[2]);
    stop.cancel();
}

/// A client that syncs (`dmover sync --delete`) with `kh` as its known hosts.
fn syncing(kh: &Path) -> Client {
    let opts = TransferOptions {
        trust: Some(dmover_net::tls::Trust::KnownHosts(kh.to_path_buf())),
        mirror: true,
        resume: true,
        delete: true,
        ..TransferOptions::default()
    };
    Client::new(opts, 1)
}

/// A sync between servers (`--delete`, pushed by A into B's mirror `m`) steered
/// with a capability B issued for it; `a_faults`: A's.
async fn mirror_pair(ttl: Duration, a_faults: dmover_core::server::Faults) -> (Pair, Client) {
    let p = pair_with(ttl, a_faults).await;
    let c = syncing(&p.b_root.parent().unwrap().join("known_hosts"));
    (p, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syncs_capability_opens_its_prunes_and_push_and_no_more() {
    let (p, c) = mirror_pair(Duration::from_secs(60), Default::default()).await;
    std::fs::create_dir(p.b_root.join("m")).unwrap();
    std::fs::write(p.b_root.join("m/extra"), b"x").unwrap();
    let a_key = c.server_key(&p.a).await.unwrap();
    let b_key = c.server_key(&p.b).await.unwrap();
    let scope = Scope::Mirror {
        dest: b"m".to_vec(),
    };
    let cap = c.request_capability(&p.b, scope, &a_key).await.unwrap();
    let tp = ThirdParty {
        mode: TpcMode::Push,
        peer: p.b.clone(),
        peer_key: b_key,
        capability: cap,
        paths: vec![b"src".to_vec()],
    };
    // A prune before the push, the push, a prune after: three sessions at B.
    let r = c.steer(&p.a, tp.clone(), Run::new()).await.unwrap();
    assert_eq!(r.summary.bytes, 100_000);
    assert_eq!(r.pruned.map(|x| x.deleted), Some(1));
    assert_eq!(std::fs::read(p.b_root.join("m/f")).unwrap().len(), 100_000);
    assert!(!p.b_root.join("m/extra").exists());
    // Used up: B refuses it, nothing changes.
    std::fs::write(p.b_root.join("m/extra"), b"x").unwrap();
    let e = c.steer(&p.a, tp.clone(), Run::new()).await.unwrap_err();
    assert!(e.to_string().contains("already used"), "{e}");
    assert!(p.b_root.join("m/extra").exists());
    // A copy's client cannot use a sync's capability for a copy (A refuses to
    // push into `m` itself: the scope is the mirror's).
    let e = p.client.steer(&p.a, tp, Run::new()).await.unwrap_err();
    assert!(e.to_string().contains("scope"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syncs_prune_after_a_push_longer_than_the_capability_is_accepted() {
    // A reads each chunk 2.5 s late: the push outlives B's capability (1 s).
    let faults = dmover_core::server::Faults {
        chunk_delay: Some(Duration::from_millis(2500)),
        ..Default::default()
    };
    let (p, c) = mirror_pair(Duration::from_secs(1), faults).await;
    std::fs::create_dir(p.b_root.join("m")).unwrap();
    std::fs::write(p.b_root.join("m/extra"), b"x").unwrap();
    let a_key = c.server_key(&p.a).await.unwrap();
    let b_key = c.server_key(&p.b).await.unwrap();
    let scope = Scope::Mirror {
        dest: b"m".to_vec(),
    };
    let cap = c.request_capability(&p.b, scope, &a_key).await.unwrap();
    let tp = ThirdParty {
        mode: TpcMode::Push,
        peer: p.b.clone(),
        peer_key: b_key,
        capability: cap,
        paths: vec![b"src".to_vec()],
    };
    let started = std::time::Instant::now();
    let r = c.steer(&p.a, tp, Run::new()).await.unwrap();
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.pruned.map(|x| x.deleted), Some(1));
    assert!(!p.b_root.join("m/extra").exists());
    assert_eq!(std::fs::read(p.b_root.join("m/f")).unwrap().len(), 100_000);
}

/// A server on loopback as a server older than `Op::ThirdPartySync` and the sync
/// scopes answers them: it authenticates anyone, and answers an `Open` it could not
/// decode (those ops, a grant of those scopes) with `Error{Protocol}` in its decoder's
/// words; `opened` counts the other `Open`s.
async fn older_server(
    stop: CancellationToken,
    opened: std::sync::Arc<std::sync::atomic::AtomicU32>,
) -> String {
    use dmover_net::control::ControlChannel;
    use dmover_net::link::SocketOptions;
    use dmover_net::listen::Listener;
    use dmover_net::tls::ServerIdentity;
    use dmover_proto::control::{
        AuthMethod, AuthOk, Control, ErrorCode, ErrorMsg, MAX_FRAME, Op, Welcome,
    };
    use dmover_proto::preamble::{ConnKind, Preamble};
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap().to_string();
    let listener = Listener::from(tcp);
    let tls = ServerIdentity::ephemeral()
        .unwrap()
        .mutual_acceptor()
        .unwrap();
    tokio::spawn(async move {
        let opts = SocketOptions::default();
        loop {
            let (mut inc, _) = tokio::select! {
                _ = stop.cancelled() => return,
                r = listener.accept(&opts) => r.unwrap(),
            };
            // One task per connection: the client dials its data connections
            // ahead, beside the control one, and those never start TLS (one
            // waited on here in the accept loop held the control connection back
            // until the client's handshake timeout; CI saw it once).
            let (opened, tls) = (opened.clone(), tls.clone());
            tokio::spawn(async move {
                let Ok(pre) = inc.read_preamble("client").await else {
                    return;
                };
                if pre.kind != ConnKind::Control {
                    return;
                }
                let answer = Preamble::new(ConnKind::Control, pre.version);
                if inc.write_preamble(answer, "client").await.is_err() {
                    return;
                }
                let Ok(tls) = tls.accept(inc.into_control()).await else {
                    return;
                };
                let mut ch =
                    ControlChannel::new(dmover_net::ControlStream::Server(tls), "c", MAX_FRAME);
                loop {
                    let msg = match ch.recv().await {
                        Ok(Control::Hello(_)) => Control::Welcome(Welcome {
                            software: "older".into(),
                            nonce: [1; 32],
                            auth: AuthMethod::None,
                        }),
                        Ok(Control::Auth(_)) => Control::AuthOk(AuthOk { proof: None }),
                        Ok(Control::Open(o)) => {
                            let unknown = match &o.op {
                                Op::ThirdPartySync(_) => true,
                                Op::Grant(g) => g.scope.uses() > 1,
                                _ => false,
                            };
                            if !unknown {
                                opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                return;
                            }
                            Control::Error(ErrorMsg {
                                code: ErrorCode::Protocol,
                                message: "malformed control message: Found an enum \
                                          discriminant that was not in the enum"
                                    .into(),
                            })
                        }
                        Ok(_) => continue,
                        Err(_) => return,
                    };
                    if ch.send(&msg).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_older_than_sync_between_servers_refuses_it_clearly() {
    use dmover_core::client::ThirdPartyCopy;
    let t = tempfile::tempdir().unwrap();
    let (a_root, b_root) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(a_root.join("src")).unwrap();
    std::fs::create_dir(&b_root).unwrap();
    std::fs::write(a_root.join("src/f"), vec![7u8; 1000]).unwrap();
    let (a, sa) = server(&a_root, Duration::from_secs(60)).await;
    let (b, sb) = server(&b_root, Duration::from_secs(60)).await;
    let stop = CancellationToken::new();
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let old = older_server(stop.clone(), opened.clone()).await;
    let c = syncing(&t.path().join("known_hosts"));
    // The older server as the dialer (push: the source) or the acceptor (the
    // destination), and the other way of dialing.
    for (mode, from, to) in [
        (TpcMode::Push, &old, &b),
        (TpcMode::Pull, &a, &old),
        (TpcMode::Push, &a, &old),
        (TpcMode::Pull, &old, &b),
    ] {
        let copy = ThirdPartyCopy {
            mode,
            source_server: from.clone(),
            sources: vec![b"src".to_vec()],
            dest_server: to.clone(),
            dest: b"m".to_vec(),
        };
        let e = c.third_party(&copy, Run::new()).await.unwrap_err();
        let e = e.to_string();
        assert!(e.contains("needs both to speak it"), "{mode:?}: {e}");
        assert!(e.contains("upgrade"), "{mode:?}: {e}");
        assert_eq!(entries(&b_root), 0, "{mode:?}");
    }
    // Nothing else was asked of it: no copy without the sync's options.
    assert_eq!(opened.load(std::sync::atomic::Ordering::Relaxed), 0);
    stop.cancel();
    sa.cancel();
    sb.cancel();
}
