//! Transport throughput benchmark (not a test): one node sends messages
//! of a fixed size to another over 127.0.0.1, each a `UdpDriver` on its
//! own pinned thread, lossless and with nftables dropping a share of the
//! packets; `iperf3 -u` is measured in the same run on the same cores for
//! comparison. Prints a markdown table of medians; bench/README.md says
//! how to run it and what the numbers were.
//!
//! ```text
//! cargo run --release --example transport_bench -- --runs 3
//! ```
//!
//! Loss needs root and `nft`; iperf3 needs `iperf3`. Without them those
//! rows say why they are missing. Only loopback addresses are used.

use clap::Parser;
use quire::net::nft::NftLoss;
use quire::net::{PeerMap, UdpConfig, UdpDriver, UdpSnmp};
use quire::transport::{ClusterKey, Endpoint, Event, SendError, TransportConfig};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(about = "quire transport throughput over loopback, beside iperf3 -u")]
struct Args {
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1024,65536")]
    sizes: Vec<usize>,
    /// Loss rates in percent, applied with nftables.
    #[arg(long, value_delimiter = ',', default_value = "0,1,5")]
    loss: Vec<u32>,
    /// Runs per cell; the table shows the median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Bytes sent per quire run with messages of 64 KiB and more.
    #[arg(long, default_value_t = 2 << 30)]
    bytes_large: usize,
    /// Bytes sent per quire run with smaller messages.
    #[arg(long, default_value_t = 256 << 20)]
    bytes_small: usize,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 4)]
    iperf3_seconds: u32,
    /// Skip iperf3.
    #[arg(long)]
    no_iperf3: bool,
    /// Path MTU given to the transport (1500, or 9000 for jumbo frames).
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
    /// Use UDP GSO/GRO (on|off).
    #[arg(long, default_value = "on")]
    offload: String,
    /// Cores for the sender and the receiver.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    cores: Vec<usize>,
    /// Override TransportConfig::nack_interval_ms (tuning experiments).
    #[arg(long)]
    nack_interval_ms: Option<u64>,
    /// Override TransportConfig::window_bytes, and the hold-back bytes
    /// with it (tuning experiments).
    #[arg(long)]
    window_bytes: Option<usize>,
    /// Print each run.
    #[arg(long)]
    verbose: bool,
}

/// Pins the calling thread to one core.
fn pin(core: usize) {
    // SAFETY: cpu_set_t is plain data; the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "warning: cannot pin to core {core}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Installs `percent`% loss on `ports` (none for 0).
fn loss_on(ports: &[u16], percent: u32) -> Result<Option<NftLoss>, String> {
    if percent == 0 {
        return Ok(None);
    }
    NftLoss::install(ports, percent)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// One quire run: what the receiver got and what it cost. Some fields are
/// only shown by `--verbose`, through `Debug`.
#[derive(Clone, Copy, Debug, Default)]
#[allow(dead_code)]
struct QuireRun {
    goodput_bytes_per_s: f64,
    rexmit_frames: u64,
    datagrams_sent: u64,
    rcvbuf_errors: u64,
    /// The receiver's NACK rounds, and how many repeated a request.
    nack_rounds: u64,
    nack_repeat_rounds: u64,
    /// The receiver's RTT estimate of the sender, µs: smoothed, minimum.
    rtt_us: u64,
    rtt_min_us: u64,
}

fn transport_config(args: &Args) -> TransportConfig {
    let d = TransportConfig::default();
    let window_bytes = args.window_bytes.unwrap_or(d.window_bytes);
    TransportConfig {
        mtu_bytes: args.mtu,
        nack_interval_ms: args.nack_interval_ms.unwrap_or(d.nack_interval_ms),
        window_bytes,
        holdback_bytes_max: d.holdback_bytes_max.max(window_bytes),
        ..d
    }
}

fn quire_run(args: &Args, size: usize, loss: u32) -> Result<QuireRun, String> {
    let total = if size >= 65536 {
        args.bytes_large
    } else {
        args.bytes_small
    };
    let count = total.div_ceil(size);
    let key = ClusterKey::derive(b"transport bench");
    let offload = args.offload == "on";
    let udp = UdpConfig {
        bind_ip: "127.0.0.1".parse().expect("ip"),
        base_port: 0,
        groups: vec![0],
        gso: offload,
        gro: offload,
        ..UdpConfig::default()
    };
    let mut drivers = Vec::new();
    for node in [1u64, 2] {
        let ep = Endpoint::new(transport_config(args), key.clone(), node, node * 7919)
            .map_err(|e| e.to_string())?;
        let (d, report) =
            UdpDriver::bind(udp.clone(), ep, PeerMap::new()).map_err(|e| e.to_string())?;
        if args.verbose {
            eprint!("node {node}:\n{report}");
        }
        drivers.push(d);
    }
    let (a0, b0) = (
        drivers[0].local_addr(0).unwrap(),
        drivers[1].local_addr(0).unwrap(),
    );
    drivers[0].peers_mut().set_group(2, 0, b0);
    drivers[1].peers_mut().set_group(1, 0, a0);
    let _loss = loss_on(&[a0.port(), b0.port()], loss)?;
    let snmp = UdpSnmp::read().ok();
    let mut receiver = drivers.pop().expect("two");
    let mut sender = drivers.pop().expect("two");
    let barrier = Arc::new(Barrier::new(2));
    let done = Arc::new(AtomicBool::new(false));
    let (rx_core, tx_core) = (args.cores[1 % args.cores.len()], args.cores[0]);

    let (b, d) = (barrier.clone(), done.clone());
    let rx = std::thread::spawn(move || {
        pin(rx_core);
        b.wait();
        let start = Instant::now();
        let mut got = 0usize;
        let mut bytes = 0usize;
        while got < count {
            receiver
                .run_once(Duration::from_millis(10))
                .expect("run_once");
            while let Some(e) = receiver.endpoint_mut().poll_event() {
                match e {
                    Event::Delivered { message, .. } => {
                        got += 1;
                        bytes += message.len();
                    }
                    Event::Skipped { .. } => panic!("skipped data in a benchmark run"),
                    _ => {}
                }
            }
        }
        let elapsed = start.elapsed();
        d.store(true, Ordering::SeqCst);
        // Acknowledge the tail so the sender can finish cleanly.
        let until = Instant::now() + Duration::from_millis(50);
        while Instant::now() < until {
            receiver
                .run_once(Duration::from_millis(5))
                .expect("run_once");
        }
        let peer = receiver.endpoint().peer_stats(1).unwrap_or_default();
        (bytes as f64 / elapsed.as_secs_f64(), peer)
    });

    let (b, d) = (barrier, done);
    let tx = std::thread::spawn(move || {
        pin(tx_core);
        let msg = vec![0xa5u8; size];
        b.wait();
        let mut sent = 0usize;
        let mut blocked = false;
        while !d.load(Ordering::SeqCst) {
            while sent < count && !blocked {
                match sender.endpoint_mut().send(2, 0, &msg) {
                    Ok(_) => sent += 1,
                    Err(SendError::WouldBlock) => blocked = true,
                    Err(e) => panic!("send: {e}"),
                }
            }
            sender
                .run_once(Duration::from_millis(10))
                .expect("run_once");
            while let Some(e) = sender.endpoint_mut().poll_event() {
                if let Event::Writable { .. } = e {
                    blocked = false;
                }
            }
        }
        let ch = sender.endpoint().channel_stats(2, 0).unwrap_or_default();
        (ch, sender.stats())
    });
    let (goodput, rx_peer) = rx.join().map_err(|_| "receiver panicked")?;
    let (ch, tx_stats) = tx.join().map_err(|_| "sender panicked")?;
    let rcvbuf_errors = match (snmp, UdpSnmp::read()) {
        (Some(a), Ok(b)) => b.since(&a).rcvbuf_errors,
        _ => 0,
    };
    Ok(QuireRun {
        goodput_bytes_per_s: goodput,
        rexmit_frames: ch.rexmit_frames,
        datagrams_sent: tx_stats.datagrams_sent,
        rcvbuf_errors,
        nack_rounds: rx_peer.nack_rounds,
        nack_repeat_rounds: rx_peer.nack_repeat_rounds,
        rtt_us: rx_peer.rtt_us,
        rtt_min_us: rx_peer.rtt_min_us,
    })
}

/// The number after `"key":` in the first object after `section`.
fn json_number(text: &str, section: &str, key: &str) -> Option<f64> {
    let at = text.find(section)?;
    let rest = &text[at..];
    let k = rest.find(&format!("\"{key}\""))?;
    let rest = &rest[k + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| {
            !(c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+')
        })
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// An iperf3 server, killed when dropped.
struct Iperf3Server(std::process::Child);

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One iperf3 UDP run at `-b 0`: the receiver's goodput in bytes/s.
/// iperf3 sets a UDP test up with a datagram that the loss rule may drop,
/// after which that client and server are stuck: each attempt therefore
/// has its own server and a time limit (`timeout`), and a few attempts
/// are made.
fn iperf3_run(args: &Args, len: usize, loss: u32, port: u16) -> Result<f64, String> {
    let _loss = loss_on(&[port], loss)?;
    let (tx_core, rx_core) = (args.cores[0], args.cores[1 % args.cores.len()]);
    let mut last_error = String::new();
    for _attempt in 0..5 {
        let _server = Iperf3Server(
            Command::new("iperf3")
                .args([
                    "-s",
                    "-1",
                    "-p",
                    &port.to_string(),
                    "-A",
                    &rx_core.to_string(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run iperf3 ({e}): apt-get install iperf3"))?,
        );
        // The server needs a moment to listen: the client is retried
        // while it is refused (bounded) rather than sleeping a guess.
        for _ in 0..50 {
            let o = Command::new("timeout")
                .args([
                    (args.iperf3_seconds + 10).to_string().as_str(),
                    "iperf3",
                    "-c",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-u",
                    "-b",
                    "0",
                    "-l",
                    &len.to_string(),
                    "-t",
                    &args.iperf3_seconds.to_string(),
                    "-A",
                    &tx_core.to_string(),
                    "-J",
                ])
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&o.stdout);
            if o.status.success() {
                if let Some(bps) = json_number(&text, "\"sum_received\"", "bits_per_second") {
                    return Ok(bps / 8.0);
                }
                last_error =
                    "no sum_received.bits_per_second in iperf3's JSON (3.12 or newer is needed)"
                        .into();
                break;
            }
            last_error =
                json_error(&text).unwrap_or_else(|| format!("iperf3 client: {}", o.status));
            if !last_error.contains("refused") {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Err(last_error)
}

/// The `"error"` string of iperf3's JSON, if any.
fn json_error(text: &str) -> Option<String> {
    let at = text.find("\"error\"")?;
    let rest = &text[at + 7..];
    let q = rest.find('"')?;
    let rest = &rest[q + 1..];
    Some(rest[..rest.find('"')?].to_string())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// "median (min–max)" in MiB/s.
fn spread(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{} ({}–{})", mib(median(v.to_vec())), mib(lo), mib(hi))
}

fn mib(bytes_per_s: f64) -> String {
    format!("{:.0}", bytes_per_s / (1 << 20) as f64)
}

fn main() {
    let args = Args::parse();
    // The datagram the transport builds: what iperf3's -l should match.
    let datagram = transport_config(&args).datagram_bytes_max();
    let frag = transport_config(&args).fragment_bytes_max();
    println!(
        "# quire transport benchmark: mtu {} (datagrams of at most {datagram} bytes, {frag}-byte \
         fragments), offload {}, cores {:?}, {} runs per cell, medians",
        args.mtu, args.offload, args.cores, args.runs
    );
    let mut lossless: Vec<(usize, f64)> = Vec::new();
    let mut iperf_lossless: Vec<(usize, f64)> = Vec::new();
    println!();
    println!("| message | loss | quire MiB/s median (min–max) | quire msgs/s | rexmit % | RcvbufErrors | iperf3 -l | iperf3 MiB/s median (min–max) | quire / iperf3 | quire / quire lossless |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for &size in &args.sizes {
        // One datagram per message below a fragment, else full datagrams.
        let iperf_len = if size <= frag { size } else { datagram };
        for &loss in &args.loss {
            let mut q = Vec::new();
            let mut rexmit = Vec::new();
            let mut rcvbuf = 0;
            let mut error = None;
            for r in 0..args.runs {
                match quire_run(&args, size, loss) {
                    Ok(run) => {
                        if args.verbose {
                            eprintln!("quire size {size} loss {loss}% run {r}: {run:?}");
                        }
                        q.push(run.goodput_bytes_per_s);
                        rexmit.push(
                            100.0 * run.rexmit_frames as f64 / run.datagrams_sent.max(1) as f64,
                        );
                        rcvbuf += run.rcvbuf_errors;
                    }
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            let mut ip = Vec::new();
            let mut ip_error = None;
            if !args.no_iperf3 {
                for r in 0..args.runs {
                    match iperf3_run(
                        &args,
                        iperf_len,
                        loss,
                        5201 + (std::process::id() % 1000) as u16,
                    ) {
                        Ok(g) => {
                            if args.verbose {
                                eprintln!(
                                    "iperf3 -l {iperf_len} loss {loss}% run {r}: {} MiB/s",
                                    mib(g)
                                );
                            }
                            ip.push(g)
                        }
                        Err(e) => {
                            ip_error = Some(e);
                            break;
                        }
                    }
                }
            }
            if let Some(e) = error {
                println!("| {size} | {loss}% | not measured: {e} | | | | | | | |");
                continue;
            }
            let qm = median(q.clone());
            let im = median(ip.clone());
            if loss == 0 {
                lossless.push((size, qm));
                iperf_lossless.push((size, im));
            }
            let base = lossless.iter().find(|(s, _)| *s == size).map(|x| x.1);
            let ratio_iperf = if im.is_finite() {
                format!("{:.2}", qm / im)
            } else {
                "-".into()
            };
            let ratio_self = base.map_or("-".into(), |b| format!("{:.2}", qm / b));
            let ip_cell = match (&ip_error, im.is_finite()) {
                (Some(e), _) => format!("not measured: {e}"),
                (None, true) => spread(&ip),
                (None, false) => "-".into(),
            };
            println!(
                "| {} | {loss}% | {} | {:.0} | {:.2} | {rcvbuf} | {iperf_len} | {ip_cell} | {ratio_iperf} | {ratio_self} |",
                if size >= 1024 { format!("{} KiB", size / 1024) } else { format!("{size} B") },
                spread(&q),
                qm / size as f64,
                median(rexmit),
            );
        }
    }
}
