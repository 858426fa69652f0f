//! `quire status`: every node's admin `/status`, as tables (groups,
//! links, quotas, scrub and repair, snapshot images staging) or one JSON
//! array; and the count of nodes that did not answer and alarms raised.

use super::cli::Target;
use super::connect::client;
use std::net::SocketAddr;

/// Prints every node's status as a table (groups, then links), or with
/// `json` as one JSON array: each node's `/status` object with its `addr`
/// added, or `{"addr", "error"}` for a node that did not answer. Returns
/// the nodes that did not answer and the alarms raised; `quire status`
/// exits 1 if either is not zero.
pub(crate) fn status(t: &Target, json: bool) -> Result<(usize, usize), String> {
    let mut c = client(t)?;
    let (mut unreachable, mut alarms) = (0, 0);
    let mut all = Vec::new();
    for (i, addr) in t.addr.iter().enumerate() {
        let v = match c.status(i) {
            Ok(j) => serde_json::from_str::<serde_json::Value>(&j).map_err(|e| e.to_string())?,
            Err(e) => {
                unreachable += 1;
                let why = match e {
                    quire::client::ClientError::Unavailable(why) => why,
                    other => other.to_string(),
                };
                // The client names the address already; say it once.
                let why = why
                    .strip_prefix(&format!("{addr}: "))
                    .unwrap_or(&why)
                    .to_string();
                if json {
                    all.push(serde_json::json!({"addr": addr.to_string(), "error": why}));
                } else {
                    say!("node at {addr}: unreachable ({why})");
                }
                continue;
            }
        };
        alarms += v["alarms"].as_array().map_or(0, Vec::len);
        if json {
            let mut v = v;
            v["addr"] = addr.to_string().into();
            all.push(v);
            continue;
        }
        print_node_status(addr, &v);
    }
    if json {
        println!("{}", serde_json::Value::Array(all));
    }
    Ok((unreachable, alarms))
}

/// A snapshot image a follower is staging, as a line of `quire status`
/// (a follower catching up on gigabytes takes a while: this says how far).
fn image_progress(g: &serde_json::Value) -> Option<String> {
    let s = &g["snapshot"];
    let image = s["image"].as_object()?;
    let n = |k: &str| {
        image
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let resumed = match s["images_resumed"].as_u64() {
        Some(r) if r > 0 => format!(", resumed at {}", s["image_resumed_at"]),
        _ => String::new(),
    };
    Some(format!(
        "catching up: snapshot image at {} staged {:.1}% ({} of {} positions{resumed})",
        n("index"),
        n("held") as f64 * 100.0 / n("total").max(1) as f64,
        n("held"),
        n("total")
    ))
}

/// One group's scrub and repair, as a line of `quire status`.
fn log_health(g: &serde_json::Value) -> String {
    let s = &g["scrub"];
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1 << 20));
    let checked = mib(s["bytes_verified"].as_u64().unwrap_or(0));
    let scrub = if s["bytes_per_s"].as_u64() == Some(0) {
        "scrub off".to_string()
    } else {
        match s["last_pass_age_ms"].as_u64() {
            Some(age) => format!(
                "scrub's last full pass ended {:.1} s ago, took {:.1} s (passes {}, {checked} checked)",
                age as f64 / 1000.0,
                s["last_pass_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
                s["passes"].as_u64().unwrap_or(0)
            ),
            None => format!("scrub: no full pass yet ({checked} checked)"),
        }
    };
    let r = &g["repair"];
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    format!(
        "{scrub}, {} damaged batches found; {} entries repaired from peers, {} missing",
        n(s, "damaged_batches"),
        n(r, "repaired"),
        n(r, "missing")
    )
}

/// One node's `/status` as text: its alarms, groups and links, each link
/// with its peer's classification by the detector (up, ip-partitioned,
/// serial-down, down, unknown).
fn print_node_status(addr: &SocketAddr, v: &serde_json::Value) {
    say!("node {} at {addr}: up {} ms", v["node"], v["uptime_ms"]);
    for alarm in v["alarms"].as_array().into_iter().flatten() {
        say!("  ALARM: {}", alarm.as_str().unwrap_or("?"));
    }
    say!("  group  role           term  leader  prefers  commit  applied  persisted  disk");
    for g in v["groups"].as_array().into_iter().flatten() {
        let n = |k: &str| g[k].as_u64().map_or("-".into(), |x| x.to_string());
        say!(
            "  {:<5}  {:<13}  {:>4}  {:>6}  {:>7}  {:>6}  {:>7}  {:>9}  {}",
            n("group"),
            g["role"].as_str().unwrap_or("?"),
            n("term"),
            n("leader"),
            n("preferred_leader"),
            n("commit"),
            n("applied"),
            n("persisted"),
            g["disk"].as_str().unwrap_or("?")
        );
    }
    for n in v["net"].as_array().into_iter().flatten() {
        say!(
            "  loop {} datagrams: {} ({})",
            n["loop"],
            n["backend"].as_str().unwrap_or("?"),
            n["detail"].as_str().unwrap_or("")
        );
    }
    for g in v["groups"].as_array().into_iter().flatten() {
        say!("  group {} log: {}", g["group"], log_health(g));
        if let Some(line) = image_progress(g) {
            say!("  group {} {line}", g["group"]);
        }
    }
    let peer_status = |peer: &serde_json::Value| {
        v["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["peer"] == *peer)
            .and_then(|p| p["status"].as_str())
            .unwrap_or("-")
            .to_string()
    };
    say!("  peer  channel  state  last heard    rtt       peer status");
    for l in v["links"].as_array().into_iter().flatten() {
        say!(
            "  {:<4}  {:<7}  {:<5}  {:<12}  {:<8}  {}",
            l["peer"].as_u64().map_or("?".into(), |p| p.to_string()),
            l["channel"].as_str().unwrap_or("?"),
            l["state"].as_str().unwrap_or("?"),
            l["last_heard_ago_ms"]
                .as_u64()
                .map_or("never".into(), |t| format!("{t} ms ago")),
            l["rtt_us"]
                .as_u64()
                .map_or("-".into(), |r| format!("{r} us")),
            peer_status(&l["peer"])
        );
    }
    let quotas = v["quotas"].as_array().into_iter().flatten();
    for (i, q) in quotas.enumerate() {
        if i == 0 {
            say!("  principal         quota bytes/s  quota req/s  charged bytes  requests  holds  held");
        }
        let n = |k: &str| q[k].as_u64().map_or("-".into(), |x| x.to_string());
        say!(
            "  {:<16}  {:>13}  {:>11}  {:>13}  {:>8}  {:>5}  {} ms",
            q["principal"].as_str().unwrap_or("?"),
            n("bytes_per_s"),
            n("requests_per_s"),
            n("charged_bytes"),
            n("charged_requests"),
            n("holds"),
            n("held_ms")
        );
    }
}
