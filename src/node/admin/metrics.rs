//! `/metrics` in the Prometheus text format: the per-group metrics
//! (`group_metrics`), then the node's own: links and peers, alarms, the
//! transport, the client server and its quotas, and the admin endpoint's
//! refusals. Reads a `NodeStatus`, never a loop.

use crate::node::admin::auth::RefusalCounts;
use crate::node::admin::http::HttpRefusals;
use crate::node::client::quota::QuotaView;
use crate::node::NodeStatus;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Labels of a per-peer transport metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerOnly {
    peer: u64,
}

/// Labels of a per-link metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkLabel {
    peer: u64,
    channel: String,
}

/// Labels of the admin endpoint's refusals.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// A per-principal quota metric: its name, help and value.
type QuotaMetric = (&'static str, &'static str, fn(&QuotaView) -> u64);

/// Labels of a per-principal metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrincipalLabel {
    principal: String,
}

/// Labels of a per-peer metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: u64,
    status: String,
}

/// The Prometheus text exposition of `s` (the admin endpoint's own
/// refusal counters at zero).
pub fn metrics_text(s: &NodeStatus) -> String {
    metrics_text_with(
        s,
        &RefusalCounts::default(),
        &HttpRefusals::default().counts(),
    )
}

/// [`metrics_text`] with the admin endpoint's refusals so far.
pub(super) fn metrics_text_with(
    s: &NodeStatus,
    refusals: &RefusalCounts,
    http_refusals: &[(&'static str, u64)],
) -> String {
    let mut reg = Registry::with_prefix("quire");
    super::group_metrics::register(&mut reg, s);
    let link_up = Family::<LinkLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "link_up",
        "1 if the link to the peer is up or late",
        link_up.clone(),
    );
    for l in &s.links {
        let label = LinkLabel {
            peer: l.peer,
            channel: l.channel.to_string(),
        };
        link_up
            .get_or_create(&label)
            .set(u64::from(l.state == "up" || l.state == "late"));
    }
    let peer_status = Family::<PeerLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "peer_status",
        "1 for the peer's current classification",
        peer_status.clone(),
    );
    for p in &s.peers {
        let label = PeerLabel {
            peer: p.peer,
            status: p.status.to_string(),
        };
        peer_status.get_or_create(&label).set(1);
    }
    let alarm = Gauge::<u64, AtomicU64>::default();
    reg.register("link_alarm", "1 while any link is dead", alarm.clone());
    alarm.set(u64::from(s.alarm));
    for (name, help, value) in [
        (
            "loop_stalls",
            "Loop turns late by more than stall_grace_ms (this node paused or starved)",
            s.stalls.count,
        ),
        (
            "loop_stalled_ms",
            "Ms of this node's own stalls, not counted against peers or timers",
            s.stalls.stalled_ms,
        ),
        (
            "loop_stall_longest_ms",
            "The longest single stall of any loop, ms",
            s.stalls.longest_ms,
        ),
        (
            "net_xdp_loops",
            "Loops whose datagrams go through AF_XDP (the rest use sockets: /status net says why)",
            s.net.iter().filter(|n| n.xdp).count() as u64,
        ),
        (
            "xdp_rx_datagrams",
            "Datagrams received through the AF_XDP rx rings",
            s.net.iter().map(|n| n.counters.rx_datagrams).sum(),
        ),
        (
            "xdp_rx_rejected",
            "Frames on the AF_XDP rx rings refused (not a UDP datagram to this node, bad IP header)",
            s.net.iter().map(|n| n.counters.rx_rejected).sum(),
        ),
        (
            "xdp_tx_datagrams",
            "Datagrams sent through the AF_XDP tx rings",
            s.net.iter().map(|n| n.counters.tx_datagrams).sum(),
        ),
        (
            "xdp_tx_via_kernel",
            "Datagrams of the AF_XDP path sent through the kernel socket (peer MAC not yet known)",
            s.net.iter().map(|n| n.counters.tx_via_kernel).sum(),
        ),
        (
            "xdp_rx_kernel_dropped",
            "Frames the kernel dropped before the AF_XDP rx ring (ring full or no free frame: the loop fell behind)",
            s.net.iter().map(|n| n.counters.rx_kernel_dropped).sum(),
        ),
        (
            "xdp_tx_ring_full",
            "Sends that found the AF_XDP tx ring or its frames all in use",
            s.net.iter().map(|n| n.counters.tx_ring_full).sum(),
        ),
    ] {
        let g = Gauge::<u64, AtomicU64>::default();
        reg.register(name, help, g.clone());
        g.set(value);
    }
    let peer_gauge = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<PeerOnly, Gauge<u64, AtomicU64>>::default();
        reg.register(name, help, f.clone());
        f
    };
    let rtt = peer_gauge(
        &mut reg,
        "transport_rtt_us",
        "Smoothed UDP round-trip time to the peer, microseconds",
    );
    let sent = peer_gauge(
        &mut reg,
        "transport_datagrams_sent",
        "Datagrams sent to the peer",
    );
    let received = peer_gauge(
        &mut reg,
        "transport_datagrams_received",
        "Authenticated datagrams received from the peer",
    );
    let nacks = peer_gauge(
        &mut reg,
        "transport_nack_rounds",
        "NACK rounds sent to the peer (gaps in its traffic)",
    );
    let rexmits = peer_gauge(
        &mut reg,
        "transport_retransmits",
        "DATA frames retransmitted to the peer (it asked for them)",
    );
    for t in &s.transport {
        let l = PeerOnly { peer: t.peer };
        rexmits.get_or_create(&l).set(t.retransmits);
        rtt.get_or_create(&l).set(t.rtt_us);
        sent.get_or_create(&l).set(t.datagrams_sent);
        received.get_or_create(&l).set(t.datagrams_received);
        nacks.get_or_create(&l).set(t.nack_rounds);
    }
    let mac = Gauge::<u64, AtomicU64>::default();
    reg.register(
        "transport_mac_failures",
        "Datagrams dropped for a bad MAC",
        mac.clone(),
    );
    mac.set(s.mac_failures);
    let malformed = Gauge::<u64, AtomicU64>::default();
    reg.register(
        "transport_malformed_dropped",
        "Datagrams dropped as malformed",
        malformed.clone(),
    );
    malformed.set(s.malformed_dropped);
    let refused = Gauge::<u64, AtomicU64>::default();
    reg.register(
        "transport_sends_refused",
        "Raft messages refused by a full transport window",
        refused.clone(),
    );
    refused.set(s.sends_refused);
    let c = &s.clients;
    let client_gauges: [(&str, &str, u64); 8] = [
        ("client_connections_accepted", "Client TCP connections accepted", c.connections_accepted),
        ("client_connections_refused", "Client connections closed at once: source address full of authenticated connections, or every authenticated slot taken at Hello", c.connections_refused),
        ("client_connections_evicted", "Unauthenticated client connections closed to make room for a newer one", c.connections_evicted),
        ("client_hello_timeouts", "Client connections closed for no Hello within client.hello_timeout_ms", c.hello_timeouts),
        ("client_auth_failures", "Client Hellos with a wrong token", c.auth_failures),
        ("client_tls_failures", "Client connections closed for a failed TLS handshake or a corrupt TLS record", c.tls_failures),
        ("client_connections_authenticated", "Client connections authenticated now", c.authenticated),
        ("client_connections_unauthenticated", "Client connections waiting for their Hello now", c.unauthenticated),
    ];
    for (name, help, value) in client_gauges {
        let g = Gauge::<u64, AtomicU64>::default();
        reg.register(name, help, g.clone());
        g.set(value);
    }
    let denials = Family::<PrincipalLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "client_denials",
        "Client requests refused as Forbidden, by principal (its credentials' grants do not cover them)",
        denials.clone(),
    );
    for (principal, n) in &c.denials {
        let label = PrincipalLabel {
            principal: principal.clone(),
        };
        denials.get_or_create(&label).set(*n);
    }
    let quota_metrics: [QuotaMetric; 6] = [
        (
            "client_quota_bytes_per_second",
            "A principal's quota of write bytes per second (node.credentials_file)",
            |q| q.quota.bytes_per_s.unwrap_or(0),
        ),
        (
            "client_quota_requests_per_second",
            "A principal's quota of write requests per second (node.credentials_file)",
            |q| q.quota.requests_per_s.unwrap_or(0),
        ),
        (
            "client_quota_charged_bytes",
            "Bytes of writes charged to a principal's quota",
            |q| q.bytes,
        ),
        (
            "client_quota_charged_requests",
            "Write requests charged to a principal's quota",
            |q| q.requests,
        ),
        (
            "client_quota_holds",
            "Times a connection of a principal was held (not read) for its quota",
            |q| q.holds,
        ),
        (
            "client_quota_held_ms",
            "Milliseconds connections of a principal were held for its quota, summed",
            |q| q.held_ms,
        ),
    ];
    for (name, help, value) in quota_metrics {
        let family = Family::<PrincipalLabel, Gauge<u64, AtomicU64>>::default();
        reg.register(name, help, family.clone());
        for q in &s.quotas {
            let label = PrincipalLabel {
                principal: q.principal.clone(),
            };
            family.get_or_create(&label).set(value(q));
        }
    }
    let admin_refusals = Family::<ReasonLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "admin_refusals",
        "Mutating admin requests refused, by reason (missing_token, malformed_token, wrong_token, browser, not_configured, token_file_unusable)",
        admin_refusals.clone(),
    );
    for (reason, n) in refusals.iter() {
        let label = ReasonLabel {
            reason: reason.to_string(),
        };
        admin_refusals.get_or_create(&label).set(n);
    }
    let admin_http_refusals = Family::<ReasonLabel, Gauge<u64, AtomicU64>>::default();
    reg.register(
        "admin_http_refusals",
        "Admin requests refused before reading them whole, by reason (busy, head_too_large, body_too_large, malformed, timed_out, handler_panicked)",
        admin_http_refusals.clone(),
    );
    for &(reason, n) in http_refusals {
        let label = ReasonLabel {
            reason: reason.to_string(),
        };
        admin_http_refusals.get_or_create(&label).set(n);
    }
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}
