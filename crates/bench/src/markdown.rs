//! `--markdown FILE`: the report written into a markdown file between two marker lines, so one
//! command regenerates BENCHMARKS.md's measured section and leaves the prose around it alone.

use std::path::Path;

use anyhow::Context;

pub const BEGIN: &str = "<!-- rbd-bench: generated section begins; `rbd-bench --markdown BENCHMARKS.md` rewrites it -->";
pub const END: &str = "<!-- rbd-bench: generated section ends -->";
/// The markers of the snapshot scenario's section (`rbd-bench --snapshots N --markdown FILE`).
pub const SNAPSHOTS_BEGIN: &str = "<!-- rbd-bench --snapshots: generated section begins; `rbd-bench --snapshots N --markdown BENCHMARKS.md` rewrites it -->";
pub const SNAPSHOTS_END: &str = "<!-- rbd-bench --snapshots: generated section ends -->";
/// The markers of the replication scenario's section (`rbd-bench --replication N --markdown
/// FILE`).
pub const REPLICATION_BEGIN: &str = "<!-- rbd-bench --replication: generated section begins; `rbd-bench --replication N --markdown BENCHMARKS.md` rewrites it -->";
pub const REPLICATION_END: &str = "<!-- rbd-bench --replication: generated section ends -->";

/// `doc` with the text between the markers replaced by `section` (the markers kept); `doc` with
/// the marked section appended when it has no markers.
///
/// # Errors
/// Only one of the markers, or the end before the begin.
#[cfg(test)]
pub fn splice(doc: &str, section: &str) -> anyhow::Result<String> {
    splice_between(doc, (BEGIN, END), section)
}

/// [`splice`] with the given pair of markers.
///
/// # Errors
/// As [`splice`].
pub fn splice_between(
    doc: &str,
    (begin_marker, end_marker): (&str, &str),
    section: &str,
) -> anyhow::Result<String> {
    let block = format!("{begin_marker}\n\n{}\n\n{end_marker}", section.trim_end());
    match (doc.find(begin_marker), doc.find(end_marker)) {
        (Some(begin), Some(end)) if begin < end => Ok(format!(
            "{}{block}{}",
            &doc[..begin],
            &doc[end + end_marker.len()..]
        )),
        (None, None) => {
            let sep = if doc.is_empty() || doc.ends_with("\n\n") {
                ""
            } else if doc.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            Ok(format!("{doc}{sep}{block}\n"))
        }
        _ => anyhow::bail!(
            "the file has a broken rbd-bench section: expected one begin marker before one end marker"
        ),
    }
}

/// Writes `section` into `path` (created if missing) between the markers.
pub fn write(path: &Path, section: &str) -> anyhow::Result<()> {
    write_between(path, (BEGIN, END), section)
}

/// [`write`] with the given pair of markers.
pub fn write_between(path: &Path, markers: (&str, &str), section: &str) -> anyhow::Result<()> {
    let doc = match std::fs::read_to_string(path) {
        Ok(doc) => doc,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let new = splice_between(&doc, markers, section).with_context(|| path.display().to_string())?;
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marked_section_is_replaced_and_the_rest_kept() {
        let doc = format!("# Title\n\nprose\n\n{BEGIN}\n\nold figures\n\n{END}\n\nmore prose\n");
        let new = splice(&doc, "new figures\n").unwrap();
        assert_eq!(
            new,
            format!("# Title\n\nprose\n\n{BEGIN}\n\nnew figures\n\n{END}\n\nmore prose\n")
        );
        assert_eq!(splice(&new, "new figures").unwrap(), new, "idempotent");
    }

    #[test]
    fn a_file_without_markers_gets_the_section_appended() {
        assert_eq!(
            splice("# Title\n", "figures").unwrap(),
            format!("# Title\n\n{BEGIN}\n\nfigures\n\n{END}\n")
        );
        assert_eq!(splice("", "x").unwrap(), format!("{BEGIN}\n\nx\n\n{END}\n"));
    }

    #[test]
    fn two_marked_sections_are_rewritten_independently() {
        let doc = format!("{BEGIN}\n\na\n\n{END}\n\n{SNAPSHOTS_BEGIN}\n\nb\n\n{SNAPSHOTS_END}\n");
        let new = splice_between(&doc, (SNAPSHOTS_BEGIN, SNAPSHOTS_END), "c").unwrap();
        assert_eq!(
            new,
            format!("{BEGIN}\n\na\n\n{END}\n\n{SNAPSHOTS_BEGIN}\n\nc\n\n{SNAPSHOTS_END}\n")
        );
        assert_eq!(splice(&new, "a").unwrap(), new);
    }

    #[test]
    fn a_broken_section_is_refused_not_guessed() {
        assert!(splice(&format!("a {END} b {BEGIN}"), "x").is_err());
        assert!(splice(&format!("a {BEGIN} b"), "x").is_err());
    }
}
