//! Packet loss and partitions on loopback ports with nftables, for tests
//! and benchmarks (`tc netem` is not available on our machines). Each rule lives in a
//! table of its own, named after the process, and is deleted when the
//! guard drops, also on panic; tables left by killed processes are removed
//! the next time one is installed. Only loopback sources are matched.

use std::io::Write;
use std::process::{Command, Stdio};

/// Why nftables rules could not be installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NftError {
    /// This host cannot install them: not root, no working `nft`, or
    /// nftables refusing even a listing (no CAP_NET_ADMIN, no nf_tables
    /// in the kernel). A test skips, saying why.
    Unavailable(String),
    /// `nft` ran and refused or failed: a bug in the rules, or this
    /// host's nftables broken. A test fails: skipping would hide it.
    Failed(String),
}

impl std::fmt::Display for NftError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NftError::Unavailable(why) => write!(f, "nftables unavailable here: {why}"),
            NftError::Failed(why) => write!(f, "nftables failed: {why}"),
        }
    }
}

impl std::error::Error for NftError {}

/// Prefix of every table this module creates.
const TABLE_PREFIX: &str = "quire_loss_";

/// An nftables table dropping a share of the UDP packets sent from
/// loopback to some ports; deleted on drop.
pub struct NftLoss {
    table: String,
}

/// An nftables table dropping every UDP packet between two loopback ports,
/// both ways or one way (a partition between two sockets); deleted on drop.
pub struct NftCut {
    _loss: NftLoss,
}

impl NftCut {
    /// Cuts UDP between the sockets on ports `a` and `b`, both ways, or
    /// says why it cannot.
    pub fn install(a: u16, b: u16) -> Result<NftCut, NftError> {
        let rules = format!(
            "ip saddr 127.0.0.0/8 udp sport {a} udp dport {b} counter drop\n    \
             ip saddr 127.0.0.0/8 udp sport {b} udp dport {a} counter drop"
        );
        Ok(NftCut {
            _loss: NftLoss::install_rules(&rules)?,
        })
    }

    /// Cuts UDP from the socket on port `from` to the one on port `to`
    /// only (a one-way partition: `to` still reaches `from`), or says why
    /// it cannot.
    pub fn one_way(from: u16, to: u16) -> Result<NftCut, NftError> {
        let rule = format!("ip saddr 127.0.0.0/8 udp sport {from} udp dport {to} counter drop");
        Ok(NftCut {
            _loss: NftLoss::install_rules(&rule)?,
        })
    }

    /// Packets dropped by the first of the two rules (`a` to `b`).
    pub fn dropped(&self) -> Option<u64> {
        self._loss.dropped()
    }
}

impl NftLoss {
    /// Installs a rule dropping `percent`% of the UDP packets to `ports`,
    /// or says why it cannot (not root, no `nft`, rule refused).
    pub fn install(ports: &[u16], percent: u32) -> Result<NftLoss, NftError> {
        let set: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
        let rule = format!(
            "ip saddr 127.0.0.0/8 udp dport {{ {} }} numgen random mod 100 < {percent} counter drop",
            set.join(", ")
        );
        Self::install_rules(&rule)
    }

    /// Installs `rules` (nft rule lines) in the input chain of a table of
    /// this process's own.
    fn install_rules(rules: &str) -> Result<NftLoss, NftError> {
        use NftError::{Failed, Unavailable};
        if !nix::unistd::geteuid().is_root() {
            return Err(Unavailable(
                "not root: nftables rules need CAP_NET_ADMIN".into(),
            ));
        }
        match Command::new("nft").arg("--version").output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => return Err(Unavailable(format!("`nft --version` failed: {}", o.status))),
            Err(e) => {
                return Err(Unavailable(format!(
                    "no `nft` ({e}): apt-get install nftables"
                )))
            }
        }
        // Root is not enough: a container without CAP_NET_ADMIN, or a
        // kernel without nf_tables, refuses every change. Listing asks the
        // same netlink family the load does and changes nothing, so its
        // refusal says "unavailable here", and a load refused after it
        // passed is the rule's fault.
        match Command::new("nft").args(["list", "tables"]).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(Unavailable(format!(
                    "`nft list tables` refused ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                )))
            }
            Err(e) => return Err(Unavailable(format!("cannot run nft: {e}"))),
        }
        remove_stale_tables();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let table = format!("{TABLE_PREFIX}{}_{nanos}", std::process::id());
        // The input hook only: a loopback packet crosses it once (output
        // would count it twice, and would turn drops into EPERM on send).
        let script = format!(
            "table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    \
             {rules}\n  }}\n}}\n"
        );
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Failed(format!("cannot run nft: {e}")))?;
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(script.as_bytes())
            .map_err(|e| Failed(format!("writing to nft: {e}")))?;
        let out = child
            .wait_with_output()
            .map_err(|e| Failed(format!("waiting for nft: {e}")))?;
        if !out.status.success() {
            return Err(Failed(format!(
                "nft refused the table ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(NftLoss { table })
    }

    /// Packets the rule dropped so far.
    pub fn dropped(&self) -> Option<u64> {
        let out = Command::new("nft")
            .args(["list", "table", "inet", &self.table])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let after = text.split("counter packets ").nth(1)?;
        after.split_whitespace().next()?.parse().ok()
    }
}

/// Deletes tables left by processes that no longer exist (killed before
/// their guard ran), so that no stray rule keeps dropping packets to ports
/// some later program may get.
fn remove_stale_tables() {
    let Ok(out) = Command::new("nft").args(["list", "tables"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.strip_prefix("table inet ") else {
            continue;
        };
        let Some(rest) = name.strip_prefix(TABLE_PREFIX) else {
            continue;
        };
        let pid = rest.split('_').next().unwrap_or("");
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("nft")
                .args(["delete", "table", "inet", name])
                .status();
            eprintln!("deleted the stale nftables table inet {name}");
        }
    }
}

impl Drop for NftLoss {
    fn drop(&mut self) {
        let r = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
        if !matches!(r, Ok(s) if s.success()) {
            eprintln!(
                "could not delete nftables table inet {}: delete it by hand ({r:?})",
                self.table
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rule nft refuses is `Failed`, never `Unavailable`: the tests that
    /// skip a fault on a host without nftables must not skip a broken rule.
    #[test]
    fn a_refused_rule_is_a_failure_not_unavailability() {
        // Where a valid rule installs, the host is able: skip only if not.
        match NftLoss::install(&[9], 1) {
            Ok(_) => {}
            Err(NftError::Unavailable(why)) => return eprintln!("skipping: {why}"),
            Err(e) => panic!("a valid rule: {e}"),
        }
        match NftLoss::install_rules("udp dport not-a-port counter drop") {
            Err(NftError::Failed(why)) => {
                assert!(why.contains("nft refused the table"), "{why}")
            }
            Err(e) => panic!("a refused rule must be Failed, got {e:?}"),
            Ok(_) => panic!("nft took a rule it cannot parse"),
        }
    }
}
