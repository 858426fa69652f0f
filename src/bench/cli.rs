//! The command line, fio style: options before the first `--name` apply to
//! every job (and override what job files say, so `--runtime=2` shortens a
//! job file); `--name=X` starts a job of its own whose options follow it;
//! bare arguments are job files. Run-wide options (`--output-format`,
//! `--eta`, `--plot`) may appear anywhere. Pure: argv and file texts in,
//! a [`RunConfig`] out.
//!
//! Hand-rolled rather than clap: fio's meaning depends on the order of the
//! options (which `--name` an option follows), which a declarative parser
//! does not model.

use super::jobfile::{self, Setting};
use super::options::{JobOptions, UsageError};
use std::path::PathBuf;

/// One output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// fio's human-readable blocks.
    Normal,
    /// One JSON document.
    Json,
    /// One `;`-separated line per job.
    Terse,
}

/// When to show the one-line progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eta {
    /// Only when stderr is a terminal.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Everything a run is configured with.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The jobs, in order.
    pub jobs: Vec<JobOptions>,
    /// Output formats, in the order given.
    pub output_formats: Vec<OutputFormat>,
    /// Progress display.
    pub eta: Eta,
    /// Where to draw the SVG plot, if anywhere.
    pub plot: Option<PathBuf>,
}

/// What the command line asks for.
#[derive(Clone, Debug)]
pub enum Command {
    /// Run the jobs.
    Run(RunConfig),
    /// Print the usage text.
    Help,
    /// Print the version.
    Version,
}

/// Options that take no value on the command line.
const FLAGS: &[&str] = &[
    "time_based",
    "group_reporting",
    "embedded",
    "tls",
    "udp_offload",
    "stonewall",
    "wait_for_previous",
];

/// The usage text.
pub const USAGE: &str = "\
usage: quire-bench [options] [jobfile]... [--name=JOB [job options]]...

fio-style benchmark of quire's storage path (ioengine=wal), replication
transport (ioengine=udp) and whole cluster (ioengine=cluster).

run options:
  --output-format=normal|json|terse[,..]   --eta=auto|always|never
  --plot FILE.svg                          throughput and latency over time
job options (also job-file keys):
  --name --ioengine=wal|udp|cluster --rw=append|read|tail|produce|consume|ledger|mixed
  --rwmixwrite --bs=4k|1k-64k --iodepth --numjobs --size --number_ios
  --runtime --time_based --ramp_time --rate_iops --rate_process=linear|poisson
  --stonewall --group_reporting --percentile_list=50:99:99.9 --directory (wal)
  --wal_segment_bytes --write_lat_log=PREFIX --log_avg_msec
  --servers=H:P,.. --token_file --admin=H:P,.. --embedded --group --queue (cluster)
  --tls --ca=FILE (cluster: TLS to the nodes; --embedded --tls makes its own CA)
  --loss=PCT (udp, root + nft) --udp_offload=0|1 --udp_mtu=1500|9000 --randseed
  --net_backend=sockets|xdp (udp: two network namespaces on a bridge, root)
See bench/README.md for every option and output key.
";

/// Parses `args` (without the program name); `read_file` reads a job file.
pub fn parse(
    args: &[String],
    read_file: &dyn Fn(&str) -> std::io::Result<String>,
) -> Result<Command, UsageError> {
    let mut formats = vec![OutputFormat::Normal];
    let mut eta = Eta::Auto;
    let mut plot = None;
    let mut globals: Vec<Setting> = Vec::new();
    let mut cmd_jobs: Vec<Vec<Setting>> = Vec::new();
    let mut files: Vec<String> = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        if arg == "--version" {
            return Ok(Command::Version);
        }
        let Some(opt) = arg.strip_prefix("--") else {
            if arg.starts_with('-') && arg.len() > 1 {
                return Err(UsageError(format!(
                    "unknown flag {arg:?} (options are --name=value)"
                )));
            }
            files.push(arg.clone());
            continue;
        };
        let (raw_key, inline) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (opt, None),
        };
        let key = raw_key.replace('-', "_");
        let value = match inline {
            Some(v) => v,
            None if FLAGS.contains(&key.as_str()) || key == "write_lat_log" => "1".into(),
            None => it
                .next()
                .cloned()
                .ok_or_else(|| UsageError(format!("--{raw_key} needs a value")))?,
        };
        let origin = format!("--{raw_key}");
        match key.as_str() {
            "output_format" => formats = parse_formats(&value)?,
            "eta" => {
                eta = match value.as_str() {
                    "auto" => Eta::Auto,
                    "always" => Eta::Always,
                    "never" => Eta::Never,
                    _ => return Err(UsageError("--eta is auto, always or never".into())),
                }
            }
            "plot" => {
                if value.is_empty() {
                    return Err(UsageError("--plot needs a file name".into()));
                }
                plot = Some(PathBuf::from(value));
            }
            _ => {
                let setting = Setting {
                    key: key.clone(),
                    value,
                    origin,
                };
                if key == "name" {
                    cmd_jobs.push(vec![setting]);
                } else if let Some(job) = cmd_jobs.last_mut() {
                    job.push(setting);
                } else {
                    globals.push(setting);
                }
            }
        }
    }
    let mut jobs = Vec::new();
    for path in &files {
        let text = read_file(path).map_err(|e| UsageError(format!("{path}: {e}")))?;
        let mut file_globals: Vec<Setting> = Vec::new();
        for section in jobfile::parse(path, &text)? {
            if section.name == "global" {
                file_globals.extend(section.settings);
                continue;
            }
            let mut job = JobOptions {
                name: section.name.clone(),
                ..JobOptions::default()
            };
            apply(&mut job, &file_globals)?;
            apply(&mut job, &section.settings)?;
            apply(&mut job, &globals)?;
            jobs.push(job);
        }
    }
    for settings in &cmd_jobs {
        let mut job = JobOptions::default();
        apply(&mut job, &globals)?;
        apply(&mut job, settings)?;
        jobs.push(job);
    }
    if jobs.is_empty() {
        if globals.is_empty() {
            return Err(UsageError(format!("no jobs given\n{USAGE}")));
        }
        // Flags alone describe one job, as most quick runs are.
        let mut job = JobOptions {
            name: "bench".into(),
            ..JobOptions::default()
        };
        apply(&mut job, &globals)?;
        jobs.push(job);
    }
    for j in &jobs {
        j.validate()?;
    }
    Ok(Command::Run(RunConfig {
        jobs,
        output_formats: formats,
        eta,
        plot,
    }))
}

fn apply(job: &mut JobOptions, settings: &[Setting]) -> Result<(), UsageError> {
    for s in settings {
        job.set(&s.key, &s.value, &s.origin)?;
    }
    Ok(())
}

fn parse_formats(value: &str) -> Result<Vec<OutputFormat>, UsageError> {
    let mut out = Vec::new();
    for f in value.split(',') {
        let f = match f.trim() {
            "normal" => OutputFormat::Normal,
            "json" => OutputFormat::Json,
            "terse" => OutputFormat::Terse,
            other => {
                return Err(UsageError(format!(
                    "--output-format: {other:?} is not normal, json or terse"
                )))
            }
        };
        if !out.contains(&f) {
            out.push(f);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], files: &[(&str, &str)]) -> Result<RunConfig, UsageError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let read = move |p: &str| {
            files
                .iter()
                .find(|(n, _)| n == p)
                .map(|(_, t)| t.clone())
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"))
        };
        match parse(&args, &read)? {
            Command::Run(c) => Ok(c),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn command_line_globals_override_job_files() {
        let c = run(
            &[
                "j.fio",
                "--runtime=2",
                "--output-format=json,terse",
                "--plot",
                "p.svg",
            ],
            &[(
                "j.fio",
                "[global]\nioengine=wal\ndirectory=/tmp/x\nruntime=10\n[a]\nbs=8k\n[b]\n",
            )],
        )
        .unwrap();
        assert_eq!(c.jobs.len(), 2);
        assert_eq!(c.jobs[0].name, "a");
        assert_eq!(c.jobs[0].bs.min_bytes, 8192);
        assert_eq!(c.jobs[1].runtime, Some(std::time::Duration::from_secs(2)));
        assert_eq!(
            c.output_formats,
            vec![OutputFormat::Json, OutputFormat::Terse]
        );
        assert_eq!(c.plot, Some(PathBuf::from("p.svg")));
    }

    #[test]
    fn name_starts_a_job() {
        let c = run(
            &[
                "--ioengine=udp",
                "--number_ios=5",
                "--name=x",
                "--bs=64",
                "--name=y",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.jobs.len(), 2);
        assert_eq!(c.jobs[0].bs.min_bytes, 64);
        assert_eq!(c.jobs[1].bs.min_bytes, 4096);
    }

    #[test]
    fn bad_input_is_a_usage_error() {
        assert!(run(&["--bs"], &[]).is_err());
        assert!(run(&["--ioengine=disk", "--runtime=1"], &[]).is_err());
        assert!(run(&["missing.fio"], &[]).is_err());
        assert!(run(&["--ioengine=wal", "--runtime=1"], &[]).is_err()); // no directory
        assert!(run(&["--eta=sometimes"], &[]).is_err());
    }
}
