//! `quire man` and `quire completions`: man pages and shell completion
//! scripts, generated from the clap definitions in cli.rs so they never
//! drift from `--help`.

use super::cli::Cli;
use std::path::{Path, PathBuf};

/// `quire man DIR`: writes `quire.1` and, for every subcommand that is
/// not hidden, `quire-SUB.1` (nested: `quire-tune-check.1`) into `dir`,
/// created if missing; returns the files written. Generated from the
/// clap definition, so the pages say what `--help` says.
pub(crate) fn man_pages(dir: &Path) -> Result<Vec<PathBuf>, String> {
    fn write(cmd: clap::Command, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
        let name = cmd.get_name().to_string();
        let path = dir.join(format!("{name}.1"));
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .render(&mut page)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::write(&path, page).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push(path);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            // clap names are `&'static str` (without its `string`
            // feature); a few page names leaked once per run.
            let full: &'static str =
                Box::leak(format!("{name}-{}", sub.get_name()).into_boxed_str());
            let sub = sub.clone().name(full);
            write(sub, dir, out)?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    write(<Cli as clap::CommandFactory>::command(), dir, &mut out)?;
    Ok(out)
}

/// `quire completions SHELL`: the completion script on stdout.
pub(crate) fn completions(shell: clap_complete::Shell) {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut cmd, "quire", &mut std::io::stdout());
}
