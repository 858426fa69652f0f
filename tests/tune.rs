//! `quire tune` on fake /proc and /sys trees: every check's OK, WARN and
//! FAIL case, `apply` fixing what is safe to fix at run time, and the disk
//! probe on a temp dir.

use quire::tune::{apply, Host, Status};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

fn put(root: &Path, path: &str, text: &str) {
    let p = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A host tuned as quire wants it.
fn good_host(root: &Path) {
    put(root, "/proc/sys/net/core/rmem_max", "16777216\n");
    put(root, "/proc/sys/net/core/wmem_max", "4194304\n");
    put(root, "/proc/sys/net/core/netdev_max_backlog", "10000\n");
    put(root, "/proc/sys/kernel/io_uring_disabled", "0\n");
    put(root, "/proc/sys/vm/swappiness", "1\n");
    put(
        root,
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "always [madvise] never\n",
    );
    put(
        root,
        "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
        "performance\n",
    );
    put(
        root,
        "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor",
        "performance\n",
    );
    put(
        root,
        "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        "tsc\n",
    );
    put(
        root,
        "/proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\n",
    );
}

fn status_of(checks: &[quire::tune::Check], name: &str) -> Status {
    checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}"))
        .status
}

#[test]
fn a_tuned_host_is_all_ok() {
    let root = tempfile::tempdir().unwrap();
    good_host(root.path());
    let checks = Host::new(root.path()).check(None);
    assert!(checks.iter().all(|c| c.status == Status::Ok), "{checks:#?}");
}

#[test]
fn an_untuned_host_warns_and_apply_fixes_what_is_safe() {
    let root = tempfile::tempdir().unwrap();
    good_host(root.path());
    put(root.path(), "/proc/sys/net/core/rmem_max", "4194304\n");
    put(
        root.path(),
        "/proc/sys/net/core/netdev_max_backlog",
        "1000\n",
    );
    put(root.path(), "/proc/sys/kernel/io_uring_disabled", "2\n");
    put(root.path(), "/proc/sys/vm/swappiness", "60\n");
    put(
        root.path(),
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "[always] madvise never\n",
    );
    put(
        root.path(),
        "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor",
        "powersave\n",
    );
    put(
        root.path(),
        "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        "hpet\n",
    );
    let host = Host::new(root.path());
    let checks = host.check(None);
    for name in [
        "net.core.rmem_max",
        "net.core.netdev_max_backlog",
        "kernel.io_uring_disabled",
        "vm.swappiness",
        "transparent hugepages",
        "CPU frequency governor",
        "clocksource",
    ] {
        assert_eq!(status_of(&checks, name), Status::Warn, "{name}");
    }
    assert!(checks
        .iter()
        .filter(|c| c.status != Status::Ok)
        .all(|c| c.fix.is_some()));
    // A dry run changes nothing.
    let said = apply(root.path(), &checks, true);
    assert!(
        said.iter().all(|l| l.starts_with("would write")),
        "{said:?}"
    );
    assert_eq!(status_of(&host.check(None), "vm.swappiness"), Status::Warn);
    // For real: everything but the clocksource (not safe at run time).
    apply(root.path(), &checks, false);
    let after = host.check(None);
    for c in &after {
        let want = if c.name == "clocksource" {
            Status::Warn
        } else {
            Status::Ok
        };
        assert_eq!(c.status, want, "{c:?}");
    }
}

#[test]
fn log_disk_checks_read_the_disk_under_the_log_directory() {
    let root = tempfile::tempdir().unwrap();
    good_host(root.path());
    let logs = tempfile::tempdir().unwrap();
    let dev = std::fs::metadata(logs.path()).unwrap().dev();
    let sys = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
    put(
        root.path(),
        &format!("{sys}/queue/scheduler"),
        "[mq-deadline] none\n",
    );
    put(root.path(), &format!("{sys}/queue/rotational"), "0\n");
    put(
        root.path(),
        &format!("{sys}/queue/write_cache"),
        "write back\n",
    );
    put(
        root.path(),
        "/proc/self/mounts",
        &format!(
            "/dev/x / ext4 rw,discard 0 0\n/dev/y {} tmpfs rw 0 0\n",
            logs.path().display()
        ),
    );
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = config(cfg_dir.path(), logs.path(), "/nonexistent/ttyS9");
    let checks = Host::new(root.path()).check(Some(&cfg));
    assert_eq!(status_of(&checks, "group 0 disk scheduler"), Status::Warn);
    assert_eq!(
        status_of(&checks, "group 0 volatile write cache"),
        Status::Warn
    );
    assert_eq!(
        status_of(&checks, "group 0 filesystem"),
        Status::Warn,
        "tmpfs is not ext4 or xfs"
    );
    assert_eq!(status_of(&checks, "serial cable to node 2"), Status::Fail);
    assert_eq!(status_of(&checks, "node.cores"), Status::Warn, "core 0");
    apply(root.path(), &checks, false);
    let after = Host::new(root.path()).check(Some(&cfg));
    assert_eq!(status_of(&after, "group 0 disk scheduler"), Status::Ok);
}

/// A node config with its log in `log` and a serial cable at `serial`.
fn config(dir: &Path, log: &Path, serial: &str) -> quire::node::daemon::config_file::DaemonConfig {
    std::fs::write(dir.join("cluster.key"), "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::write(dir.join("client.token"), "token").unwrap();
    let text = format!(
        "[node]\nid = 1\ncluster_key_file = \"cluster.key\"\nauth_token_file = \"client.token\"\ncores = [0]\n\n\
         [[peers]]\nid = 2\nudp = \"127.0.0.1:7500\"\nserial = \"{serial}\"\n\n\
         [[peers]]\nid = 3\nudp = \"127.0.0.1:7600\"\n\n\
         [[disks]]\npath = \"{}\"\ngroup = 0\n\n\
         [client]\nplain = true\n",
        log.join("g0").display()
    );
    std::fs::write(dir.join("node.toml"), text).unwrap();
    quire::node::daemon::config_file::load(&dir.join("node.toml")).expect("a valid config")
}

#[test]
fn the_command_exits_1_on_a_failure_and_prints_json() {
    let root = tempfile::tempdir().unwrap();
    good_host(root.path());
    let logs = tempfile::tempdir().unwrap();
    let cfg_dir = tempfile::tempdir().unwrap();
    config(cfg_dir.path(), logs.path(), "/nonexistent/ttyS9");
    let out = Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["tune", "check", "--json", "--root"])
        .arg(root.path())
        .arg("--config")
        .arg(cfg_dir.path().join("node.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let serial = v
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "serial cable to node 2")
        .unwrap();
    assert_eq!(serial["status"], "FAIL");
    assert!(serial["fix"].as_str().unwrap().contains("dialout"));
}

#[test]
fn the_disk_probe_recommends_a_flush_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["tune", "disk", "--seconds", "0.05"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("recommend: storage.flush_bytes_max = "),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.contains(" KiB ")).count(),
        5,
        "{text}"
    );
}
