//! UDP segmentation offload through the forwarder, and the link MTU.
//!
//! A sender using `UDP_SEGMENT` hands the kernel 40 datagrams per `send`; with USO
//! the TUN device passes them to the forwarder as one super-packet, which must still
//! lose single datagrams at the asked rate and deliver the others intact.
//!
//! These need root, `/dev/net/tun` and `ip`. Without them they skip with a loud
//! message, unless `DMOVER_REQUIRE_NETLAB=1`, when they fail.

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dmover_netlab::{Emulator, Lab, LinkSpec};

static SERIAL: Mutex<()> = Mutex::new(());

fn guard(test: &str) -> Option<MutexGuard<'static, ()>> {
    if let Err(why) = dmover_netlab::available() {
        if std::env::var("DMOVER_REQUIRE_NETLAB").is_ok_and(|v| v == "1") {
            panic!("{test}: netlab unavailable but DMOVER_REQUIRE_NETLAB=1: {why}");
        }
        eprintln!("\n!!! SKIPPING {test}: netlab is unavailable here: {why} !!!\n");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|p| p.into_inner()))
}

fn name(test: &str) -> String {
    format!("u{}-{test}", std::process::id() % 100_000)
}

const SIZE: usize = 1200;
const PER_SEND: usize = 40;

fn setsockopt(fd: &impl AsRawFd, level: i32, opt: i32, v: i32) -> std::io::Result<()> {
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
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Datagram `seq`: its number, then bytes that depend on it and their position.
fn fill(seq: u64, d: &mut [u8]) {
    d[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in d[8..].iter_mut().enumerate() {
        *b = (seq as usize * 7 + i) as u8;
    }
}

fn intact(d: &[u8]) -> Option<u64> {
    if d.len() != SIZE {
        return None;
    }
    let seq = u64::from_le_bytes(d[..8].try_into().unwrap());
    let mut want = vec![0u8; SIZE];
    fill(seq, &mut want);
    (want == d).then_some(seq)
}

/// Sends `bursts` × [`PER_SEND`] datagrams from a to b with `UDP_SEGMENT`, a burst
/// per millisecond; returns (datagrams received intact, datagrams received damaged).
fn udp_gso_bursts(lab: &Lab, bursts: usize) -> (Vec<bool>, u64) {
    let total = bursts * PER_SEND;
    let rx = lab
        .b()
        .in_netns(|| UdpSocket::bind((lab.b().addr, 0)))
        .unwrap()
        .unwrap();
    // Room for everything, so the socket never drops what the link delivered.
    setsockopt(&rx, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 256 << 20).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let to: SocketAddr = rx.local_addr().unwrap();
    let tx = lab
        .a()
        .in_netns(|| UdpSocket::bind((lab.a().addr, 0)))
        .unwrap()
        .unwrap();
    tx.connect(to).unwrap();
    setsockopt(&tx, libc::SOL_UDP, libc::UDP_SEGMENT, SIZE as i32).unwrap();
    setsockopt(&tx, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 16 << 20).unwrap();
    let receiver = std::thread::spawn(move || {
        let mut seen = vec![false; total];
        let mut damaged = 0u64;
        let mut buf = vec![0u8; 65_536];
        while let Ok(n) = rx.recv(&mut buf) {
            match intact(&buf[..n]) {
                Some(s) if (s as usize) < total => seen[s as usize] = true,
                _ => damaged += 1,
            }
        }
        (seen, damaged)
    });
    let mut burst = vec![0u8; SIZE * PER_SEND];
    let start = Instant::now();
    for b in 0..bursts {
        for (i, d) in burst.chunks_mut(SIZE).enumerate() {
            fill((b * PER_SEND + i) as u64, d);
        }
        loop {
            match tx.send(&burst) {
                Ok(n) => {
                    assert_eq!(n, burst.len());
                    break;
                }
                // A full device queue: try again (the datagrams did not leave).
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("send: {e}"),
            }
        }
        let due = start + Duration::from_millis(b as u64 + 1);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    receiver.join().unwrap()
}

#[test]
fn udp_gso_bursts_cross_whole_without_loss_and_lose_single_datagrams_with_it_and_one_read_each_without_uso()
 {
    let Some(_g) = guard("udp_gso_bursts") else {
        return;
    };
    let spec = LinkSpec {
        rtt: Duration::from_millis(2),
        emulator: Emulator::Forwarder,
        ..LinkSpec::default()
    };
    let lab = Lab::up(&name("uso"), &spec).unwrap();
    let before = lab.stats();
    let (seen, damaged) = udp_gso_bursts(&lab, 200);
    let s = lab.stats().since(&before);
    let got = seen.iter().filter(|&&x| x).count();
    eprintln!(
        "no loss: {got}/{} datagrams; a->b {} reads for {} segments; uso {}",
        seen.len(),
        s.a_to_b.packets_in,
        s.a_to_b.segments_in,
        s.uso
    );
    assert_eq!(damaged, 0);
    assert_eq!(got, seen.len(), "every datagram arrives");
    if s.uso {
        assert!(
            s.a_to_b.segments_in >= 10 * s.a_to_b.packets_in,
            "the forwarder sees super-packets: {:?}",
            s.a_to_b
        );
    } else {
        eprintln!("\n!!! this kernel has no UDP segmentation offload on TUN (before 6.2) !!!\n");
    }
    lab.down().unwrap();

    let loss = 0.02;
    let lossy = LinkSpec {
        loss,
        seed: 43,
        ..spec.clone()
    };
    let lab = Lab::up(&name("usoloss"), &lossy).unwrap();
    let before = lab.stats();
    let (seen, damaged) = udp_gso_bursts(&lab, 500);
    let s = lab.stats().since(&before);
    let sent = seen.len() as u64;
    let lost = seen.iter().filter(|&&x| !x).count() as u64;
    let f = lost as f64 / sent as f64;
    eprintln!(
        "2 % loss: {lost}/{sent} datagrams lost ({:.3} %), forwarder dropped {} of {} \
         segments in {} reads",
        f * 100.0,
        s.a_to_b.loss_drops,
        s.a_to_b.segments_in,
        s.a_to_b.packets_in
    );
    assert_eq!(damaged, 0, "the survivors of cut super-packets are intact");
    assert!((0.014..=0.026).contains(&f), "lost {:.3} %", f * 100.0);
    // Every lost datagram is one the forwarder dropped on purpose (the receive buffer
    // holds the whole test), bar a few segments of the lab's own TCP probe.
    assert!(
        lost.abs_diff(s.a_to_b.loss_drops) <= 5,
        "lost {lost}, forwarder loss drops {}",
        s.a_to_b.loss_drops
    );
    if s.uso {
        assert!(s.a_to_b.segments_in >= 10 * s.a_to_b.packets_in);
        // Loss per datagram, not per super-packet: far more losses than the
        // super-packets that had one would give when dropped whole at that rate.
        assert!(lost as f64 > 5.0 * loss * s.a_to_b.packets_in as f64);
    }
    lab.down().unwrap();

    // Without USO (as on kernels before 6.2) the same bursts cross one read each.
    let plain = LinkSpec {
        uso: false,
        ..spec.clone()
    };
    let lab = Lab::up(&name("nouso"), &plain).unwrap();
    let before = lab.stats();
    let (seen, damaged) = udp_gso_bursts(&lab, 50);
    let s = lab.stats().since(&before);
    assert!(!s.uso);
    assert_eq!(damaged, 0);
    assert!(seen.iter().all(|&x| x), "every datagram arrives");
    assert_eq!(s.a_to_b.packets_in, s.a_to_b.segments_in, "{:?}", s.a_to_b);
    assert!(s.a_to_b.packets_in >= seen.len() as u64);
    lab.down().unwrap();
}

#[test]
fn the_link_mtu_refuses_bigger_df_datagrams_and_sets_the_tcp_mss() {
    let Some(_g) = guard("mtu") else {
        return;
    };
    let spec = LinkSpec {
        emulator: Emulator::Forwarder,
        mtu: Some(1280),
        ..LinkSpec::default()
    };
    let lab = Lab::up(&name("mtu"), &spec).unwrap();
    for h in [lab.a(), lab.b()] {
        let out = h
            .command("ip")
            .args(["link", "show", dmover_netlab::DEVICE])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("mtu 1280 "), "{text}");
    }
    let rx = lab
        .b()
        .in_netns(|| UdpSocket::bind((lab.b().addr, 0)))
        .unwrap()
        .unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let tx = lab
        .a()
        .in_netns(|| UdpSocket::bind((lab.a().addr, 0)))
        .unwrap()
        .unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    setsockopt(
        &tx,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
    )
    .unwrap();
    // 1280 bytes of IP packet fit; one more byte does not and DF forbids fragments.
    tx.send(&[7u8; 1280 - 28]).unwrap();
    let mut buf = [0u8; 2000];
    assert_eq!(rx.recv(&mut buf).unwrap(), 1252);
    let e = tx.send(&[7u8; 1280 - 27]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE), "{e}");

    // TCP's MSS follows: 1280 - 20 (IP) - 20 (TCP) - 12 (timestamps).
    let listener = lab
        .b()
        .in_netns(|| TcpListener::bind((lab.b().addr, 0)))
        .unwrap()
        .unwrap();
    let to = listener.local_addr().unwrap();
    let c = lab
        .a()
        .in_netns(|| TcpStream::connect_timeout(&to, Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    let mut mss: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: TCP_MAXSEG writes an int; `mss` and `len` are valid out pointers.
    let r = unsafe {
        libc::getsockopt(
            c.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mut mss as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0);
    assert!((1200..=1240).contains(&mss), "MSS {mss}");
    lab.down().unwrap();
}
