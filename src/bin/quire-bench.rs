//! quire-bench: fio-style benchmark of quire's storage path, transport and
//! cluster. Thin: parsing, running and reporting live in `quire::bench`.
//! Exit codes: 0 success, 1 a job failed, 2 bad flags or job files.

use quire::bench::cli::{self, Command, OutputFormat};
use quire::bench::{plot, report, run};
use std::process::ExitCode;

fn main() -> ExitCode {
    // `quire-bench ... | head` ends quietly instead of panicking on the
    // closed pipe. Reports are printed after the jobs (and any embedded
    // cluster) are done; sockets send with MSG_NOSIGNAL.
    quire::sigpipe::on_closed_pipe(true);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let read = |p: &str| std::fs::read_to_string(p);
    let cfg = match cli::parse(&args, &read) {
        Ok(Command::Run(cfg)) => cfg,
        Ok(Command::Help) => {
            print!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("quire-bench {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("quire-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match run::execute(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("quire-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    for f in &cfg.output_formats {
        match f {
            OutputFormat::Normal => print!("{}", report::normal(&result)),
            OutputFormat::Json => println!(
                "{}",
                serde_json::to_string_pretty(&report::json(&result)).unwrap_or_default()
            ),
            OutputFormat::Terse => print!("{}", report::terse(&result)),
        }
    }
    let mut ok = result.jobs.iter().all(|j| j.error.is_none());
    match run::write_lat_logs(&result) {
        Ok(files) => {
            for f in files {
                eprintln!("quire-bench: wrote {f}");
            }
        }
        Err(e) => {
            eprintln!("quire-bench: {e}");
            ok = false;
        }
    }
    if let Some(path) = &cfg.plot {
        match plot::draw(&result, path) {
            Ok(()) => eprintln!("quire-bench: plot in {}", path.display()),
            Err(e) => {
                eprintln!("quire-bench: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
