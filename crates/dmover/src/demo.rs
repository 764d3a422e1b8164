//! `dmover demo`: the whole engine on this host in one command. Starts a server on
//! loopback over a temporary directory, generates a mixed dataset (thousands of small
//! files plus a few large ones), pushes it, compares both trees byte for byte, prints
//! the summary and removes everything.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use dmover_bench::mkdata::{self, Profile, Spec};
use dmover_core::server::{Server, ServerConfig};
use dmover_core::transfer::{Endpoint, Transfer, TransferSpec, Watch};
use dmover_store::verify;
use tokio_util::sync::CancellationToken;

use crate::args::DemoArgs;
use crate::output::{self, Direction};
use crate::resolve::ClientSetup;

/// `dmover demo`, with its client resolved from `a.transfer`.
pub fn run(a: DemoArgs, client: ClientSetup) -> anyhow::Result<ExitCode> {
    let tmp = tempfile::Builder::new()
        .prefix("dmover-demo-")
        .tempdir()
        .context("creating a temporary directory")?;
    let src = tmp.path().join("dataset");
    let root = tmp.path().join("server-root");
    std::fs::create_dir(&root).context("creating the server root")?;

    eprintln!("1/4 generating a demo dataset in {} ...", src.display());
    let spec = Spec::new(Profile::Demo).scale(a.scale);
    let made = mkdata::generate(&src, &spec, None).context("generating the dataset")?;
    eprintln!("    {made}");

    let mut opts = client.options;
    opts.token = None;
    // The demo's server has a key made for it; pin it in the demo's own directory.
    opts.trust = Some(dmover_net::tls::Trust::KnownHosts(
        tmp.path().join("known_hosts"),
    ));
    let rt = crate::resolve::runtime(opts.streams.max(2))?;
    let server = Server::new(ServerConfig::new(&root))?;
    let shutdown = CancellationToken::new();
    let addr = rt.block_on(async {
        let listener =
            dmover_net::listen::Listener::bind(([127, 0, 0, 1], 0).into(), &Default::default())?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let (server, stop) = (server.clone(), shutdown.clone());
        tokio::spawn(async move { server.serve(listener, stop).await });
        anyhow::Ok(addr)
    })?;
    eprintln!(
        "2/4 server listening on {addr} (TLS key {}), serving {}",
        server.fingerprint(),
        root.display()
    );

    eprintln!("3/4 pushing {} to dmover://{addr}/ ...", src.display());
    let mut spec = TransferSpec::copy(
        vec![Endpoint::local(&src)],
        Endpoint::Remote {
            server: addr.to_string(),
            path: Vec::new(),
        },
    )
    .options(opts);
    spec.disk_threads = client.io_threads.map(usize::from);
    let transfer = Transfer::new(spec)?;
    crate::interrupt::cancel_on_ctrl_c(&rt, transfer.canceller());
    let started = Instant::now();
    let result = rt.block_on(transfer.run(Watch::events(), |_| {}));
    let secs = started.elapsed().as_secs_f64();
    let progress = transfer.progress().clone();
    drop(transfer);
    let result = result.map(|f| f.report);
    let ok = result.is_ok();
    let code = output::report(
        result,
        Direction::Push,
        None,
        secs,
        Default::default(),
        false,
        false,
        &progress,
        None,
    );
    shutdown.cancel();
    if !ok {
        return Ok(code);
    }

    eprintln!("4/4 comparing both trees byte for byte ...");
    let t = Instant::now();
    let compared = verify::compare_trees(&src, &root.join("dataset"));
    match compared {
        Ok(c) => eprintln!(
            "    identical: {} files, {} dirs, {} symlinks, {} bytes (compared in {:.2} s)",
            c.files,
            c.dirs,
            c.symlinks,
            c.bytes,
            t.elapsed().as_secs_f64()
        ),
        Err(e) => bail!("the copy differs from the source: {e}"),
    }
    drop(rt);
    if a.keep {
        let kept = tmp.keep();
        eprintln!("kept {}", kept.display());
    } else {
        eprintln!("removed {}", tmp.path().display());
    }
    Ok(code)
}
