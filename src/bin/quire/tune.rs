//! `quire tune check|apply|disk`: the host checklist, the run-time
//! settings applied, the disk probed; and which failures are bad usage
//! (exit code 2).

use super::cli::TuneCmd;
use std::path::PathBuf;
use std::time::Duration;

/// Why a `quire tune` command did not run: a bad `--config` or argument
/// (exit code 2) or a failure (1).
pub(crate) enum TuneError {
    Usage(String),
    Failed(String),
}

/// The node config `--config` names, if any; a bad one is bad usage.
fn load_config(
    path: &Option<PathBuf>,
) -> Result<Option<quire::node::daemon::config_file::DaemonConfig>, TuneError> {
    match path {
        None => Ok(None),
        Some(p) => quire::node::daemon::config_file::load(p)
            .map(Some)
            .map_err(|e| TuneError::Usage(e.to_string())),
    }
}

/// Runs one `quire tune` command: whether every check passed or every
/// change applied, or why it did not run.
pub(crate) fn tune(what: TuneCmd) -> Result<bool, TuneError> {
    use quire::tune::{self, Host, Status};
    match what {
        TuneCmd::Check { config, json, root } => {
            let cfg = load_config(&config)?;
            let checks = Host::new(root).check(cfg.as_ref());
            if json {
                println!("{}", tune::to_json(&checks));
            } else {
                print!("{}", tune::render(&checks));
            }
            Ok(checks.iter().all(|c| c.status != Status::Fail))
        }
        TuneCmd::Apply {
            config,
            dry_run,
            yes,
            root,
        } => {
            let cfg = load_config(&config)?;
            let checks = Host::new(&root).check(cfg.as_ref());
            let lines = tune::apply(&root, &checks, dry_run || !yes);
            if lines.is_empty() {
                println!("nothing to change at run time");
            }
            for l in &lines {
                println!("{l}");
            }
            Ok(!lines.iter().any(|l| l.starts_with("could not")))
        }
        TuneCmd::Disk { dir, seconds } => {
            if !dir.is_dir() {
                let what = if dir.exists() {
                    "not a directory"
                } else {
                    "no such directory; it is not created (that would probe the filesystem of its parent)"
                };
                return Err(TuneError::Usage(format!(
                    "tune disk {}: {what}: name an existing directory on the disk to probe",
                    dir.display()
                )));
            }
            let p = tune::disk::probe(&dir, Duration::from_secs_f64(seconds.max(0.05)))
                .map_err(|e| TuneError::Failed(format!("probing {}: {e}", dir.display())))?;
            print!("{}", tune::disk::render(&p));
            Ok(true)
        }
    }
}
