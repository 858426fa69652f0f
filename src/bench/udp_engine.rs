//! `ioengine=udp`: the replication transport alone, between two endpoints
//! on 127.0.0.1 (`net::UdpDriver` around `transport::Endpoint`, default
//! configs but for `udp_mtu`, as `examples/transport_bench.rs` and its
//! `--mtu`). The job's thread drives the
//! sender; a helper thread drives the receiver and stamps each delivery,
//! so latency is send to in-order delivery at the receiver. Each message
//! carries its operation id in its first 8 bytes; the rest is one payload
//! allocated when the engine opens, so an operation costs the transport
//! and not the benchmark (fio likewise reuses its buffers).
//!
//! `loss=PCT` installs an nftables rule dropping that share of the
//! datagrams on the two ports (root and `nft` only; otherwise the job fails
//! and says why, rather than measuring a loss that is not there).
//!
//! `net_backend=sockets|xdp` puts the two ends in two network namespaces
//! joined by a bridge (`net::netns`, root only), the sender's and the
//! receiver's veth each with its own address; `xdp` attaches the AF_XDP
//! path to both drivers (copy mode on a veth). The loss rule then sits on
//! the bridge, where both paths cross it. Same topology for both values,
//! so their runs compare the datagram paths and nothing else.

use super::engine::{Completion, Engine, EngineReport, Op, TransportBlock};
use super::error::BenchError;
use super::options::JobOptions;
use super::options::NetBackend;
use crate::net::netns::{BridgeRule, TestNet};
use crate::net::nft::NftLoss;
use crate::net::xdp::{Backend, XdpConfig, XdpNode};
use crate::net::{PeerMap, UdpConfig, UdpDriver};
use crate::transport::{ClusterKey, Endpoint, Event, SendError, TransportConfig};
use crossbeam_channel::{Receiver, TryRecvError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SENDER: u64 = 1;
const RECEIVER: u64 = 2;
const GROUP: u32 = 0;
/// The longest the sender's socket wait may take before the delivery
/// channel is checked again.
const SENDER_TURN: Duration = Duration::from_micros(200);
/// The group's port in the namespaces of `net_backend` (each namespace
/// has ports of its own).
const NETNS_BASE_PORT: u16 = 7300;

/// What the receiver thread hands back at the end.
struct ReceiverEnd {
    nack_rounds: u64,
    skipped: u64,
}

/// The udp engine of one job clone.
pub struct UdpEngine {
    sender: UdpDriver,
    /// The bytes every message is cut from (`bs` at its largest); a send
    /// writes the operation id into the first 8 and the transport copies
    /// the message, so the buffer is free again when `send` returns.
    payload: Vec<u8>,
    /// Messages (operation id, bytes) refused by a full window, to send
    /// on `Writable`.
    blocked: VecDeque<(u64, usize)>,
    window_stalls: u64,
    deliveries: Receiver<(u64, Instant, u64)>,
    stop: Arc<AtomicBool>,
    receiver: Option<JoinHandle<ReceiverEnd>>,
    loss: Option<NftLoss>,
    loss_percent: u32,
    /// The endpoints' config (for the report's note).
    transport: TransportConfig,
    /// Where the ends run, for the report's note.
    place: String,
    /// `net_backend`: the loss rule on the bridge and the namespaces
    /// (dropped in this order, after the drivers stop).
    bridge_loss: Option<BridgeRule>,
    _net: Option<TestNet>,
}

impl UdpEngine {
    /// Binds both endpoints for `job` and starts the receiver thread.
    pub fn open(job: &JobOptions) -> Result<UdpEngine, BenchError> {
        let key = ClusterKey::derive(b"quire-bench udp");
        let udp = UdpConfig {
            bind_ip: "127.0.0.1".parse().expect("a literal address"),
            base_port: 0,
            groups: vec![GROUP],
            gso: job.udp_offload,
            gro: job.udp_offload,
            ..UdpConfig::default()
        };
        let transport = TransportConfig {
            mtu_bytes: job.udp_mtu_bytes,
            ..TransportConfig::default()
        };
        let net = match job.net_backend {
            Some(_) => Some(TestNet::create(2).map_err(|source| BenchError::Nft {
                what: "net_backend needs two network namespaces (root, ip, nft)".into(),
                source,
            })?),
            None => None,
        };
        let mut drivers = Vec::new();
        let mut place = "127.0.0.1".to_string();
        for (i, node) in [SENDER, RECEIVER].into_iter().enumerate() {
            let ep = Endpoint::new(transport.clone(), key.clone(), node, node * 7919 + job.seed)
                .map_err(BenchError::Transport)?;
            let Some(net) = &net else {
                let (d, _report) = UdpDriver::bind(udp.clone(), ep, PeerMap::new())
                    .map_err(BenchError::io("binding UDP on 127.0.0.1"))?;
                drivers.push(d);
                continue;
            };
            let ip = net.nodes[i].v4;
            let udp = UdpConfig {
                bind_ip: ip,
                base_port: NETNS_BASE_PORT,
                ..udp.clone()
            };
            let xdp = job.net_backend == Some(NetBackend::Xdp);
            let mtu = transport.mtu_bytes;
            let (d, how) = net
                .in_node(i, move || -> Result<_, BenchError> {
                    let (mut d, _report) = UdpDriver::bind(udp, ep, PeerMap::new())
                        .map_err(BenchError::io(format!("binding UDP on {ip}")))?;
                    if !xdp {
                        return Ok((d, "sockets".to_string()));
                    }
                    let cfg = XdpConfig {
                        backend: Backend::Xdp,
                        ..XdpConfig::default()
                    };
                    let program = XdpNode::open(&cfg, ip, mtu, &[(NETNS_BASE_PORT, 0)])
                        .map(std::sync::Arc::new)
                        .map_err(BenchError::Xdp)?;
                    let port = program.port(0).map_err(BenchError::Xdp)?;
                    let how = port.describe();
                    d.attach_xdp(port);
                    Ok((d, how))
                })
                .map_err(BenchError::io("entering a network namespace"))??;
            place = format!("two network namespaces on a bridge, {how}");
            drivers.push(d);
        }
        let mut receiver = drivers.pop().expect("two drivers");
        let mut sender = drivers.pop().expect("two drivers");
        let (a, b) = (
            sender
                .local_addr(GROUP)
                .ok_or(BenchError::Misuse("sender has no socket"))?,
            receiver
                .local_addr(GROUP)
                .ok_or(BenchError::Misuse("receiver has no socket"))?,
        );
        sender.peers_mut().set_group(RECEIVER, GROUP, b);
        receiver.peers_mut().set_group(SENDER, GROUP, a);
        let mut bridge_loss = None;
        let loss = match &net {
            _ if job.loss_percent == 0 => None,
            Some(net) => {
                bridge_loss = Some(net.loss(&[NETNS_BASE_PORT], job.loss_percent).map_err(
                    |source| BenchError::Nft {
                        what: format!("loss={}", job.loss_percent),
                        source,
                    },
                )?);
                None
            }
            None => Some(
                NftLoss::install(&[a.port(), b.port()], job.loss_percent).map_err(|source| {
                    BenchError::Nft {
                        what: format!("loss={} needs root and nft (nftables)", job.loss_percent),
                        source,
                    }
                })?,
            ),
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_rx = stop.clone();
        let handle = std::thread::Builder::new()
            .name("bench-udp-rx".into())
            .spawn(move || {
                let mut skipped = 0;
                let run = |receiver: &mut UdpDriver, skipped: &mut u64| {
                    let _ = receiver.run_once(Duration::from_millis(1));
                    while let Some(e) = receiver.endpoint_mut().poll_event() {
                        match e {
                            Event::Delivered { message, .. } => {
                                let at = Instant::now();
                                if let Some(id) = message.get(..8) {
                                    let id = u64::from_le_bytes(id.try_into().expect("8 bytes"));
                                    let _ = tx.send((id, at, message.len() as u64));
                                }
                                // As a daemon's loop does, so the benchmark
                                // pays for reassembly what the daemon pays.
                                receiver.endpoint_mut().recycle_message(message);
                            }
                            Event::Skipped {
                                first_seq,
                                last_seq,
                                ..
                            } => *skipped += last_seq - first_seq + 1,
                            _ => {}
                        }
                    }
                };
                while !stop_rx.load(Ordering::Relaxed) {
                    run(&mut receiver, &mut skipped);
                }
                // A few more turns so the sender's last frames are acknowledged.
                let until = Instant::now() + Duration::from_millis(20);
                while Instant::now() < until {
                    run(&mut receiver, &mut skipped);
                }
                let peer = receiver.endpoint().peer_stats(SENDER).unwrap_or_default();
                ReceiverEnd {
                    nack_rounds: peer.nack_rounds,
                    skipped,
                }
            })
            .map_err(BenchError::io("starting the receiver thread"))?;
        Ok(UdpEngine {
            sender,
            payload: vec![0xa5u8; (job.bs.max_bytes as usize).max(8)],
            blocked: VecDeque::new(),
            window_stalls: 0,
            deliveries: rx,
            stop,
            receiver: Some(handle),
            loss,
            loss_percent: job.loss_percent,
            transport,
            place,
            bridge_loss,
            _net: net,
        })
    }

    fn send_blocked(&mut self) -> Result<(), BenchError> {
        while let Some(&(id, bytes)) = self.blocked.front() {
            let msg = &mut self.payload[..bytes];
            msg[..8].copy_from_slice(&id.to_le_bytes());
            match self.sender.endpoint_mut().send(RECEIVER, GROUP, msg) {
                Ok(_) => {
                    self.blocked.pop_front();
                }
                Err(SendError::WouldBlock) => {
                    self.window_stalls += 1;
                    return Ok(());
                }
                Err(e) => return Err(BenchError::TransportSend(e)),
            }
        }
        Ok(())
    }
}

impl Engine for UdpEngine {
    fn submit(&mut self, op: Op, _done: &mut Vec<Completion>) -> Result<(), BenchError> {
        let bytes = op.bytes.clamp(8, self.payload.len());
        self.blocked.push_back((op.id, bytes));
        self.send_blocked()
    }

    fn poll(&mut self, timeout: Duration, done: &mut Vec<Completion>) -> Result<(), BenchError> {
        let until = Instant::now() + timeout;
        loop {
            self.send_blocked()?;
            let wait = until
                .saturating_duration_since(Instant::now())
                .min(SENDER_TURN);
            self.sender
                .run_once(wait)
                .map_err(BenchError::io("sender socket"))?;
            while let Some(e) = self.sender.endpoint_mut().poll_event() {
                if let Event::Writable { .. } = e {
                    self.send_blocked()?;
                }
            }
            loop {
                match self.deliveries.try_recv() {
                    Ok((id, at, bytes)) => done.push(Completion {
                        id,
                        result: Ok(bytes),
                        finished: Some(at),
                    }),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        return Err(BenchError::Stopped("the receiver thread"))
                    }
                }
            }
            if !done.is_empty() || Instant::now() >= until {
                return Ok(());
            }
        }
    }

    fn finish(&mut self) -> Result<EngineReport, BenchError> {
        self.stop.store(true, Ordering::Relaxed);
        // Keep acknowledging on this side while the receiver winds down.
        let until = Instant::now() + Duration::from_millis(20);
        while Instant::now() < until {
            let _ = self.sender.run_once(Duration::from_millis(1));
            while self.sender.endpoint_mut().poll_event().is_some() {}
        }
        let end = self
            .receiver
            .take()
            .ok_or(BenchError::Misuse("finish called twice"))?
            .join()
            .map_err(|_| BenchError::Panicked("the receiver thread"))?;
        let ch = self
            .sender
            .endpoint()
            .channel_stats(RECEIVER, GROUP)
            .unwrap_or_default();
        let net = self.sender.stats();
        Ok(EngineReport {
            transport: Some(TransportBlock {
                datagrams_sent: net.datagrams_sent,
                rexmit_frames: ch.rexmit_frames,
                rexmit_bytes: ch.rexmit_bytes,
                nacks_received: ch.nacks_received,
                nack_rounds: end.nack_rounds,
                window_stalls: self.window_stalls,
                skipped: end.skipped,
                loss_percent: self.loss_percent,
                nft_dropped: match &self.bridge_loss {
                    Some(rule) => rule.dropped(),
                    None => self.loss.as_ref().and_then(|l| l.dropped()),
                },
            }),
            notes: vec![format!(
                "udp: {}, mtu {} (datagrams of at most {} bytes), GSO {}",
                self.place,
                self.transport.mtu_bytes,
                self.transport.datagram_bytes_max(),
                if self.sender.gso().is_on() {
                    "on"
                } else {
                    "off"
                }
            )],
            ..EngineReport::default()
        })
    }
}

impl Drop for UdpEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
    }
}
