//! fio job files: `[global]` and job sections of `key=value` lines. Pure
//! text parsing; the values are checked by [`super::options`].
//!
//! Written here rather than with an INI crate because fio's dialect is not
//! quite INI: keys without a value are flags (`time_based`), `[global]` may
//! appear more than once and applies to the jobs after it, and job sections
//! keep their order and may repeat names. Each is a line or two here and a
//! fight with a general-purpose parser.

use super::options::UsageError;

/// Job files larger than this are refused (they are untrusted input).
pub const JOB_FILE_BYTES_MAX: usize = 1 << 20;

/// One `key[=value]` line, with where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Option name.
    pub key: String,
    /// Value (`"1"` for a bare flag).
    pub value: String,
    /// `FILE:LINE`, for error messages.
    pub origin: String,
}

/// One section of a job file, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// Section name (`global` for a global section).
    pub name: String,
    /// Its settings, in order.
    pub settings: Vec<Setting>,
}

/// Parses the text of job file `path` into its sections.
pub fn parse(path: &str, text: &str) -> Result<Vec<Section>, UsageError> {
    if text.len() > JOB_FILE_BYTES_MAX {
        return Err(UsageError(format!(
            "{path}: job file is larger than {JOB_FILE_BYTES_MAX} bytes"
        )));
    }
    let mut sections: Vec<Section> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let origin = format!("{path}:{}", n + 1);
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest
                .strip_suffix(']')
                .map(str::trim)
                .filter(|n| !n.is_empty() && !n.contains(['[', ']']))
                .ok_or_else(|| {
                    UsageError(format!(
                        "{origin}: a section header is [name], got {line:?}"
                    ))
                })?;
            sections.push(Section {
                name: name.to_string(),
                settings: Vec::new(),
            });
            continue;
        }
        let Some(section) = sections.last_mut() else {
            return Err(UsageError(format!(
                "{origin}: option {line:?} before any [section]"
            )));
        };
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (line, "1"),
        };
        if key.is_empty() {
            return Err(UsageError(format!(
                "{origin}: a line of the form key=value, got {line:?}"
            )));
        }
        section.settings.push(Setting {
            key: key.replace('-', "_"),
            value: value.to_string(),
            origin,
        });
    }
    Ok(sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_flags_and_comments() {
        let s = parse(
            "t.fio",
            "; comment\n[global]\nioengine=wal\ntime_based\n\n# more\n[a]\nbs = 4k\n",
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "global");
        assert_eq!(s[0].settings[1].key, "time_based");
        assert_eq!(s[0].settings[1].value, "1");
        assert_eq!(s[1].settings[0].value, "4k");
        assert_eq!(s[1].settings[0].origin, "t.fio:8");
    }

    #[test]
    fn malformed_files_are_errors() {
        assert!(parse("t", "bs=4k\n").is_err());
        assert!(parse("t", "[global\n").is_err());
        assert!(parse("t", "[]\n").is_err());
        assert!(parse("t", "[a]\n=3\n").is_err());
    }
}
