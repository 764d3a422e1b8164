//! A `UDP_SEGMENT` sender through an emulated link, for measuring what UDP
//! segmentation offload saves the forwarder (docs/benchmarks.md, issue 43 item 3).
//!
//! ```text
//! udp_gso_bench [--no-uso] [--seconds 5] [--pace-mbit N] [--rtt-ms 0] [--loss 0]
//! ```
//!
//! Sends bursts of 40 datagrams of 1200 bytes (as a QUIC stack does) from host a to
//! host b for `--seconds`, as fast as the socket takes them or paced to `--pace-mbit`
//! of UDP payload, and prints one JSON line: datagrams sent and received per second,
//! the a→b forwarder thread's reads per second and CPU (fraction of a core), its
//! release lateness and whether it limited the run. Needs root.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dmover_netlab::{Emulator, Lab, LinkSpec};

const SIZE: usize = 1200;
const PER_SEND: usize = 40;

fn setsockopt(fd: &impl AsRawFd, level: i32, opt: i32, v: i32) {
    // SAFETY: the option value is an int, passed by pointer with its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
}

fn main() {
    let mut uso = true;
    let mut seconds = 5.0f64;
    let mut pace_mbit: Option<f64> = None;
    let mut rtt_ms = 0u64;
    let mut loss = 0.0f64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().expect("a value");
        match a.as_str() {
            "--no-uso" => uso = false,
            "--seconds" => seconds = val().parse().expect("seconds"),
            "--pace-mbit" => pace_mbit = Some(val().parse().expect("Mbit/s")),
            "--rtt-ms" => rtt_ms = val().parse().expect("ms"),
            "--loss" => loss = val().parse().expect("fraction"),
            _ => panic!("unknown argument {a}"),
        }
    }
    let spec = LinkSpec {
        rtt: Duration::from_millis(rtt_ms),
        loss,
        emulator: Emulator::Forwarder,
        uso,
        ..LinkSpec::default()
    };
    let lab = Lab::up(&format!("usobench{}", std::process::id() % 10_000), &spec).expect("lab up");
    let rx = lab
        .b()
        .in_netns(|| UdpSocket::bind((lab.b().addr, 0)))
        .unwrap()
        .unwrap();
    setsockopt(&rx, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 64 << 20);
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let to = rx.local_addr().unwrap();
    let tx = lab
        .a()
        .in_netns(|| UdpSocket::bind((lab.a().addr, 0)))
        .unwrap()
        .unwrap();
    tx.connect(to).unwrap();
    setsockopt(&tx, libc::SOL_UDP, libc::UDP_SEGMENT, SIZE as i32);
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let receiver = std::thread::spawn(move || {
        let mut n = 0u64;
        let mut buf = vec![0u8; 65_536];
        loop {
            match rx.recv(&mut buf) {
                Ok(_) => n += 1,
                Err(_) if d.load(Ordering::Relaxed) => return n,
                Err(_) => {}
            }
        }
    });
    let burst = vec![0x5au8; SIZE * PER_SEND];
    let before = lab.stats();
    let start = Instant::now();
    let length = Duration::from_secs_f64(seconds);
    let per_burst =
        pace_mbit.map(|m| Duration::from_secs_f64(burst.len() as f64 * 8.0 / (m * 1e6)));
    let mut sent = 0u64;
    let mut bursts = 0u32;
    while start.elapsed() < length {
        match tx.send(&burst) {
            Ok(_) => sent += PER_SEND as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                std::thread::sleep(Duration::from_micros(50))
            }
            Err(e) => panic!("send: {e}"),
        }
        bursts += 1;
        if let Some(p) = per_burst {
            if let Some(w) = (start + p * bursts).checked_duration_since(Instant::now()) {
                std::thread::sleep(w);
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(100) + spec.rtt);
    let s = lab.stats().since(&before);
    done.store(true, Ordering::Relaxed);
    let received = receiver.join().unwrap();
    let d = &s.a_to_b;
    println!(
        "{}",
        serde_json::json!({
            "uso": s.uso,
            "pace_mbit": pace_mbit,
            "sent_dgrams_per_s": (sent as f64 / elapsed).round(),
            "recv_dgrams_per_s": (received as f64 / elapsed).round(),
            "recv_mbit_per_s": (received as f64 * SIZE as f64 * 8.0 / elapsed / 1e6).round(),
            "fwd_reads_per_s": (d.packets_in as f64 / s.elapsed_seconds).round(),
            "fwd_segments_per_s": (d.segments_in as f64 / s.elapsed_seconds).round(),
            "fwd_cpu_a_to_b": (d.cpu_seconds / s.elapsed_seconds * 1000.0).round() / 1000.0,
            "fwd_late_p50_us": d.late_p50_us,
            "fwd_late_p99_us": d.late_p99_us,
            "fwd_late_max_us": d.late_max_us.round(),
            "fwd_overflow_drops": d.overflow_drops,
            "fwd_queue_drops": d.queue_drops,
            "fwd_limited": s.limited(),
        })
    );
    lab.down().expect("lab down");
}
