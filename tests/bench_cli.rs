//! quire-bench as an operator runs it: every engine from a shipped job file
//! and from flags, the JSON schema, terse output, and exit code 2 for bad
//! input. Runs are short (a few hundred ms each) and assert on shape and
//! counts, never on timing.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quire-bench"))
        .args(args)
        .arg("--eta=never")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("quire-bench runs")
}

fn ok_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--output-format=json");
    let out = bench(&all);
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

/// The documented keys (bench/README.md, "JSON output"), checked on every
/// job of `doc`.
fn check_schema(doc: &Value) {
    assert_eq!(doc["bench_version"], 1);
    assert!(doc["timestamp"].as_u64().is_some());
    assert!(doc["disk_util"].is_array());
    assert!(doc.get("udp_errors").is_some());
    let jobs = doc["jobs"].as_array().expect("jobs[]");
    assert!(!jobs.is_empty());
    for j in jobs {
        for key in [
            "jobname",
            "groupid",
            "error",
            "job options",
            "job_runtime",
            "errors",
            "total_err",
            "fsync",
            "notes",
            "cpu_us_per_op",
            "client_cpu_us_per_op",
            "cpu",
        ] {
            assert!(j.get(key).is_some(), "jobs[].{key} missing in {j}");
        }
        for dir in ["write", "read"] {
            let d = &j[dir];
            for key in [
                "io_bytes",
                "io_kbytes",
                "bw_bytes",
                "bw",
                "iops",
                "runtime",
                "total_ios",
            ] {
                assert!(d[key].is_number(), "jobs[].{dir}.{key} missing");
            }
            for lat in ["slat_ns", "clat_ns", "lat_ns"] {
                for key in ["min", "max", "mean", "stddev", "N"] {
                    assert!(d[lat][key].is_number(), "jobs[].{dir}.{lat}.{key} missing");
                }
            }
            assert!(d["clat_ns"]["percentile"].is_object());
            assert!(d["lat_ns"]["percentile"].is_object());
        }
    }
}

fn write_ops(job: &Value) -> u64 {
    job["write"]["total_ios"].as_u64().unwrap()
}

#[test]
fn udp_from_flags_json_schema_and_percentiles() {
    let doc = ok_json(&[
        "--name=udp-flags",
        "--ioengine=udp",
        "--bs=1k-4k",
        "--iodepth=16",
        "--number_ios=2000",
        "--percentile_list=50:99",
    ]);
    check_schema(&doc);
    let j = &doc["jobs"][0];
    assert_eq!(write_ops(j), 2000);
    assert_eq!(j["total_err"], 0);
    let p = j["write"]["clat_ns"]["percentile"].as_object().unwrap();
    assert_eq!(p.keys().collect::<Vec<_>>(), ["50.000000", "99.000000"]);
    assert!(p["50.000000"].as_u64().unwrap() <= p["99.000000"].as_u64().unwrap());
    let t = &j["transport"];
    assert!(t["datagrams_sent"].as_u64().unwrap() > 0);
    assert!(j["write"]["io_bytes"].as_u64().unwrap() >= 2000 * 1024);
}

#[test]
fn udp_with_jumbo_datagrams_delivers_every_message() {
    let doc = ok_json(&[
        "--name=udp-jumbo",
        "--ioengine=udp",
        "--udp_mtu=9000",
        "--bs=1k-64k",
        "--iodepth=32",
        "--number_ios=500",
    ]);
    check_schema(&doc);
    let j = &doc["jobs"][0];
    assert_eq!(write_ops(j), 500);
    assert_eq!(j["total_err"], 0);
    assert_eq!(j["transport"]["skipped"], 0);
    let notes: Vec<&str> = j["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("mtu 9000 (datagrams of at most 8952 bytes)")),
        "{notes:?}"
    );
}

#[test]
fn udp_from_the_lossless_job_file() {
    let doc = ok_json(&["bench/jobs/transport-lossless.fio", "--runtime=0.2"]);
    check_schema(&doc);
    let jobs = doc["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    // stonewall: one group after the other.
    assert_eq!(jobs[0]["groupid"], 0);
    assert_eq!(jobs[1]["groupid"], 1);
    assert!(jobs.iter().all(|j| write_ops(j) > 0));
}

#[test]
fn wal_from_flags_and_from_job_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = format!("--directory={}", dir.path().display());
    let started = std::time::Instant::now();
    let doc = ok_json(&[
        "--name=wal-flags",
        "--ioengine=wal",
        &d,
        "--wal_segment_bytes=4m",
        "--bs=4k",
        "--iodepth=8",
        "--number_ios=500",
    ]);
    check_schema(&doc);
    let j = &doc["jobs"][0];
    assert_eq!(write_ops(j), 500);
    let fsync = j["fsync"].as_array().unwrap();
    assert_eq!(fsync.len(), 1);
    assert!(fsync[0]["flushes"].as_u64().unwrap() > 0);
    assert!(fsync[0]["lat_ns"]["percentile"].is_object());
    assert!(fsync[0]["bytes_per_flush"].as_u64().unwrap() >= 4096);
    // Every flush's bytes reached the disk within the process's life:
    // the rate over the run is at least their sum over that time.
    let wall = started.elapsed().as_secs_f64();
    let written =
        fsync[0]["flushes"].as_f64().unwrap() * fsync[0]["bytes_per_flush"].as_f64().unwrap();
    let disk_rate = fsync[0]["disk_bytes_per_s"].as_f64().unwrap();
    assert!(written >= 500.0 * 4096.0, "{written}");
    assert!(
        disk_rate * wall >= written,
        "{disk_rate} B/s over at most {wall} s, {written} B"
    );

    let doc = ok_json(&[
        "bench/jobs/disk-group-commit.fio",
        &d,
        "--runtime=0.1",
        "--wal_segment_bytes=4m",
    ]);
    let jobs = doc["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4);
    assert!(jobs
        .iter()
        .all(|j| write_ops(j) > 0 && j["fsync"][0]["flushes"].as_u64().unwrap() > 0));

    // Mixed reads and writes; the normal output has fio's blocks.
    let out = bench(&[
        "--name=wal-mixed",
        "--ioengine=wal",
        &d,
        "--wal_segment_bytes=4m",
        "--rw=mixed",
        "--rwmixwrite=50",
        "--number_ios=400",
        "--iodepth=4",
        "--output-format=normal,terse",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "write: IOPS=",
        "read: IOPS=",
        "slat (",
        "clat (",
        "lat (",
        "clat percentiles",
        "fsync latency",
        "Run status group 0",
        "\n1;quire-bench-",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    // Nothing left behind in the directory beyond what the engine made and removed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn cluster_embedded_from_the_job_file_with_replication_block() {
    let dir = tempfile::tempdir().unwrap();
    let d = format!("--directory={}", dir.path().display());
    let svg = dir.path().join("plot.svg");
    let doc = ok_json(&[
        "bench/jobs/cluster-append.fio",
        "--embedded",
        &d,
        "--runtime=0.4",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    check_schema(&doc);
    let jobs = doc["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for j in jobs {
        assert!(write_ops(j) > 0, "{j}");
        let r = &j["replication"];
        for key in [
            "commit_lat_ns",
            "nack_rounds",
            "retransmits",
            "leader_changes",
            "elections",
            "errors",
        ] {
            assert!(r.get(key).is_some(), "replication.{key} missing");
        }
        assert!(
            r["retransmits"].is_u64(),
            "the nodes export their retransmits: {r}"
        );
        assert_eq!(
            j["fsync"].as_array().unwrap().len(),
            3,
            "one fsync block per node"
        );
        // Embedded: the daemons' PIDs are known, so their CPU per op is.
        let daemons = j["cpu_us_per_op"].as_f64().expect("cpu_us_per_op");
        let client = j["client_cpu_us_per_op"]
            .as_f64()
            .expect("client_cpu_us_per_op");
        assert!(daemons > 0.0 && client > 0.0, "{j}");
        assert_eq!(j["cpu"]["daemons"], 3);
        assert!(j["cpu"]["ops"].as_u64().unwrap() >= write_ops(j));
    }
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("throughput"));
}

/// `--plot`'s legend is a strip under both charts (issue 17, item 12: it
/// covered the curves): every job has its entry, and each entry is below
/// every point of every curve. (`bench::plot`'s unit test checks that no
/// curve, however it runs, passes under an entry.)
#[test]
fn the_plots_legend_is_below_every_curve() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("plot.svg");
    ok_json(&[
        "bench/jobs/transport-lossless.fio",
        "--runtime=0.3",
        "--log_avg_msec=20",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(svg).unwrap();
    let number = |tag: &str, name: &str| -> f64 {
        let at = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        tag[at..].split('"').next().unwrap().parse().unwrap()
    };
    // Each <text> element's y and content; the legend's say "(group N)".
    let legend_tops: Vec<f64> = svg
        .split("<text")
        .skip(1)
        .filter(|t| t.split("</text>").next().unwrap().contains("(group "))
        .map(|t| number(t, "y") - number(t, "font-size"))
        .collect();
    assert_eq!(legend_tops.len(), 2, "one entry per job:\n{svg}");
    let curve_bottom = svg
        .split("<polyline")
        .skip(1)
        .map(|t| {
            t.split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        })
        .filter(|points| points.split_whitespace().count() >= 3)
        .flat_map(|points| {
            points
                .split_whitespace()
                .map(|xy| xy.split(',').nth(1).unwrap())
        })
        .map(|y| y.parse::<f64>().unwrap())
        .fold(f64::MIN, f64::max);
    assert!(curve_bottom > 0.0, "no curve drawn:\n{svg}");
    for top in legend_tops {
        assert!(
            top > curve_bottom,
            "a legend entry at y {top} is over a curve (down to {curve_bottom})"
        );
    }
}

#[test]
fn cluster_embedded_from_flags() {
    let doc = ok_json(&[
        "--name=c",
        "--ioengine=cluster",
        "--embedded",
        "--rw=mixed",
        "--iodepth=4",
        "--number_ios=200",
        "--bs=512",
    ]);
    let j = &doc["jobs"][0];
    let total = write_ops(j) + j["read"]["total_ios"].as_u64().unwrap();
    assert_eq!(total, 200);
    assert_eq!(j["total_err"], 0);
}

/// Appends through the producer: `iodepth` far above what one thread per
/// operation allowed (1024), a linger and a batch bound, and every append
/// confirmed; the normal output names both CPU figures.
#[test]
fn cluster_appends_pipelined_at_a_deep_iodepth() {
    let out = bench(&[
        "--name=deep",
        "--ioengine=cluster",
        "--embedded",
        "--rw=append",
        "--iodepth=2048",
        "--numjobs=2",
        "--linger_us=200",
        "--batch_bytes_max=8k",
        "--in_flight_max=64",
        "--number_ios=6000",
        "--bs=1k",
        "--output-format=normal,json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let (normal, json) = text.split_at(text.find("\n{").expect("the JSON after the normal output"));
    assert!(normal.contains("cpu per confirmed op"), "{normal}");
    let doc: Value = serde_json::from_str(json).unwrap();
    check_schema(&doc);
    for j in doc["jobs"].as_array().unwrap() {
        assert_eq!(write_ops(j), 6000, "{j}");
        assert_eq!(j["total_err"], 0, "{}", j["errors"]);
        assert!(j["cpu_us_per_op"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn queue_produce_then_consume_from_the_job_file() {
    let doc = ok_json(&[
        "bench/jobs/queue-produce-consume.fio",
        "--embedded",
        "--runtime=0.3",
        "--iodepth=4",
    ]);
    check_schema(&doc);
    let jobs = doc["jobs"].as_array().unwrap();
    assert_eq!(jobs[0]["job options"]["rw"], "produce");
    assert!(write_ops(&jobs[0]) > 0);
    assert_eq!(jobs[1]["job options"]["rw"], "consume");
    assert!(jobs[1]["read"]["total_ios"].as_u64().unwrap() > 0);
    assert_eq!(jobs[1]["total_err"], 0, "{}", jobs[1]["errors"]);
}

#[test]
fn bad_flags_and_job_files_exit_2_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.fio");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--ioengine=disk".into(), "--runtime=1".into()],
            "ioengine",
        ),
        (
            vec![
                "--ioengine=udp".into(),
                "--bs=4q".into(),
                "--runtime=1".into(),
            ],
            "bs",
        ),
        (
            vec!["--ioengine=wal".into(), "--runtime=1".into()],
            "directory",
        ),
        (vec!["--ioengine=udp".into()], "runtime"),
        (vec!["no-such-file.fio".into()], "no-such-file.fio"),
        (vec![bad.display().to_string()], "bad.fio:2"),
        (
            vec![
                "--ioengine=udp".into(),
                "--rw=consume".into(),
                "--runtime=1".into(),
            ],
            "not supported by ioengine=udp",
        ),
    ];
    std::fs::write(&bad, "[job]\niodepth=many\n").unwrap();
    for (args, reason) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = bench(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(reason),
            "{args:?}: {err:?} does not say {reason:?}"
        );
    }
    // Binary junk is an error too, not a panic.
    std::fs::write(&bad, [0xffu8, 0xfe, b'[', 0, b']', b'\n']).unwrap();
    let out = bench(&[bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(Path::new(&bad).exists());
}
