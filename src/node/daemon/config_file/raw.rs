//! The file's sections as serde sees them: every section denies unknown
//! keys and every tunable is optional, so that an absent key takes the
//! default of the config it feeds. Also the rewording of serde's errors
//! into the file's terms (keys, not fields; the key path in front).

use super::{bad, Bad};
use crate::consensus::NodeId;
use crate::transport::GroupId;
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) node: RawNode,
    #[serde(default)]
    pub(super) peers: Vec<RawPeer>,
    pub(super) disks: Vec<RawDisk>,
    #[serde(default)]
    pub(super) udp: RawUdp,
    #[serde(default)]
    pub(super) timers: RawTimers,
    #[serde(default)]
    pub(super) storage: RawStorage,
    #[serde(default)]
    pub(super) transport: RawTransport,
    #[serde(default)]
    pub(super) serial: RawSerial,
    #[serde(default)]
    pub(super) snapshot: RawSnapshot,
    #[serde(default)]
    pub(super) client: RawClient,
    #[serde(default)]
    pub(super) net: RawNet,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNet {
    pub(super) backend: Option<String>,
    pub(super) xdp_umem_frames: Option<u32>,
    pub(super) xdp_zero_copy: Option<bool>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    pub(super) hello_timeout_ms: Option<u64>,
    pub(super) connections_max: Option<usize>,
    pub(super) unauthenticated_max: Option<usize>,
    pub(super) connections_per_source_max: Option<usize>,
    pub(super) plain: Option<bool>,
    pub(super) tls_cert_file: Option<PathBuf>,
    pub(super) tls_key_file: Option<PathBuf>,
    pub(super) tls_client_ca_file: Option<PathBuf>,
    pub(super) tls_client_crl_file: Option<PathBuf>,
    pub(super) tls_min_version: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSnapshot {
    pub(super) interval_ms: Option<u64>,
    pub(super) entries: Option<u64>,
    pub(super) bytes: Option<u64>,
    pub(super) chunk_bytes: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    pub(super) id: NodeId,
    pub(super) cluster_key_file: PathBuf,
    pub(super) auth_token_file: PathBuf,
    pub(super) admin_token_file: Option<PathBuf>,
    pub(super) credentials_file: Option<PathBuf>,
    pub(super) cores: Option<Vec<usize>>,
    pub(super) client_listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) admin_tls: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeer {
    pub(super) id: NodeId,
    pub(super) udp: String,
    pub(super) serial: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDisk {
    pub(super) path: PathBuf,
    pub(super) group: GroupId,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUdp {
    pub(super) bind: Option<String>,
    pub(super) base_port: Option<u16>,
    pub(super) recv_buffer_bytes: Option<usize>,
    pub(super) send_buffer_bytes: Option<usize>,
    pub(super) send_batch_datagrams_max: Option<usize>,
    pub(super) recv_batch_max: Option<usize>,
    pub(super) recv_datagrams_per_run_max: Option<usize>,
    pub(super) gso: Option<bool>,
    pub(super) gso_segments_max: Option<usize>,
    pub(super) gro: Option<bool>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTimers {
    pub(super) keepalive_ms: Option<u64>,
    pub(super) warntime_ms: Option<u64>,
    pub(super) deadtime_ms: Option<u64>,
    pub(super) initdead_ms: Option<u64>,
    pub(super) disk_stall_ms: Option<u64>,
    pub(super) election_timeout_ms: Option<u64>,
    pub(super) heartbeat_interval_ms: Option<u64>,
    pub(super) fast_campaign_jitter_ms: Option<u64>,
    pub(super) preferred_leaders: Option<bool>,
    pub(super) preferred_leader_hold_ms: Option<u64>,
    pub(super) stall_grace_ms: Option<u64>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorage {
    pub(super) segment_bytes: Option<u64>,
    pub(super) flush_bytes_max: Option<usize>,
    pub(super) flushes_in_flight_max: Option<u32>,
    pub(super) backend: Option<String>,
    pub(super) direct_io: Option<bool>,
    pub(super) read_cache_bytes: Option<usize>,
    pub(super) scrub_bytes_per_s: Option<u64>,
    pub(super) space_retry_ms: Option<u64>,
    pub(super) segments_ahead: Option<u32>,
    pub(super) segments_recycled_max: Option<u32>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTransport {
    pub(super) mtu_bytes: Option<usize>,
    pub(super) window_bytes: Option<usize>,
    pub(super) window_frames_max: Option<usize>,
    pub(super) history_bytes_max: Option<usize>,
    pub(super) message_bytes_max: Option<usize>,
    pub(super) holdback_bytes_max: Option<usize>,
    pub(super) holdback_frames_max: Option<usize>,
    pub(super) events_bytes_max: Option<usize>,
    pub(super) nack_delay_min_us: Option<u64>,
    pub(super) nack_delay_max_us: Option<u64>,
    pub(super) nack_interval_ms: Option<u64>,
    pub(super) nack_ranges_max: Option<usize>,
    pub(super) rexmit_batch_max: Option<usize>,
    pub(super) rexmit_min_interval_ms: Option<u64>,
    pub(super) ack_delay_us: Option<u64>,
    pub(super) ack_every_bytes: Option<usize>,
    pub(super) probe_interval_ms: Option<u64>,
    pub(super) peers_max: Option<usize>,
    pub(super) channels_max: Option<usize>,
    pub(super) retired_epochs_max: Option<usize>,
    pub(super) epoch_silence_ms: Option<u64>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSerial {
    pub(super) baud: Option<u32>,
}

/// TOML text to the raw sections; type errors, missing and unknown keys
/// are named by their key path.
pub(super) fn parse(text: &str) -> Result<RawFile, Bad> {
    let de = toml::Deserializer::parse(text).map_err(|e| {
        bad(
            "",
            format!("not valid TOML{}: {}", at_line(text, &e), e.message()),
        )
    })?;
    serde_path_to_error::deserialize::<_, RawFile>(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        serde_error(text, &path, &inner)
    })
}

/// " (line N)" for an error with a span.
fn at_line(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

fn join_key(path: &str, key: &str) -> String {
    if path.is_empty() || path == "." {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Rewrites serde's messages for missing and unknown fields in the file's
/// terms (keys, not fields), with the key path in front.
fn serde_error(text: &str, path: &str, e: &toml::de::Error) -> Bad {
    let msg = e.message();
    let line = at_line(text, e);
    // serde's wording: "missing field `id`".
    if let Some(name) = msg
        .strip_prefix("missing field `")
        .and_then(|r| r.strip_suffix('`'))
    {
        // The span is the table's: no use for the top level.
        let line = if path == "." { "" } else { line.as_str() };
        return bad(
            join_key(path, name),
            format!("missing; this key is required{line}"),
        );
    }
    // serde's wording: "unknown field `x`, expected one of `a`, `b`" (or
    // "expected `a`", or "there are no fields").
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((name, expected)) = rest.split_once('`') {
            let expected = expected
                .trim_start_matches(", ")
                .replace("expected one of ", "")
                .replace("expected ", "")
                .replace("` or `", ", ")
                .replace('`', "");
            // The path already ends with the unknown key.
            let key = if path == name || path.ends_with(&format!(".{name}")) {
                path.to_string()
            } else {
                join_key(path, name)
            };
            return bad(
                key,
                format!("unknown key{line}; the keys here are: {expected}"),
            );
        }
    }
    let key = if path == "." { "" } else { path };
    bad(key, format!("{}{line}", plain_types(msg)))
}

/// serde names Rust types ("expected u16"); the operator wants the range.
fn plain_types(msg: &str) -> String {
    msg.replace("expected u16", "expected an integer in 0..=65535")
        .replace("expected u32", "expected an integer in 0..=4294967295")
        .replace("expected u64", "expected an integer >= 0")
        .replace("expected usize", "expected an integer >= 0")
}
