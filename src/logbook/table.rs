//! An experiment's table as a person reads it: what every run shares is said once, above the table; the
//! table keeps the runs' differing settings and the numbers that compare them, drops a column empty for
//! every run, and stays within `MAX_COLUMNS`; long paths (checkpoints, TensorBoard folders) go in a list
//! under it.

use std::fmt::Write as _;

/// How a column is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// What the comparison is about: kept unless empty for every run.
    Key,
    /// A setting: a column where runs differ, else one entry of the shared line.
    Setting,
    /// A secondary number: a column where runs differ (while the table has room), else shared.
    Extra,
    /// A path: listed under the table.
    File,
}

/// The widest table written: wider ones do not fit a screen.
pub const MAX_COLUMNS: usize = 14;

/// What "no value" looks like in a cell.
const EMPTY: &str = "–";

/// The table (`columns` with each run's `rows`, the first column naming the run) as markdown.
pub fn render(columns: &[(&str, Keep)], rows: &[Vec<String>]) -> String {
    let column = |i: usize| rows.iter().map(move |r| r[i].as_str());
    let empty = |i: usize| column(i).all(|c| c == EMPTY);
    let same = |i: usize| {
        let first = rows.first().map(|r| r[i].as_str());
        column(i).all(|c| Some(c) == first)
    };
    let status = columns.iter().position(|(n, _)| *n == "status");
    let mut shared = Vec::new();
    let keys: Vec<usize> = (1..columns.len())
        .filter(|&i| columns[i].1 == Keep::Key && Some(i) != status && !empty(i))
        .collect();
    let mut differing = Vec::new();
    for (i, (name, keep)) in columns.iter().enumerate().skip(1) {
        if *keep == Keep::Setting && !empty(i) {
            match same(i) {
                true => shared.push(format!("{name} {}", rows[0][i])),
                false => differing.push(i),
            }
        }
    }
    // The run, its status and the numbers first claim their room; differing settings take what is left
    // (the rest are named under the table), then secondary numbers.
    let mut kept: Vec<usize> = std::iter::once(0).chain(status).collect();
    let room = MAX_COLUMNS.saturating_sub(kept.len() + keys.len());
    let unshown: Vec<&str> = differing.iter().skip(room).map(|&i| columns[i].0).collect();
    kept.extend(differing.iter().take(room));
    kept.extend(&keys);
    // A secondary number the runs share is said once too; differing ones fill the table's room.
    for (i, (name, keep)) in columns.iter().enumerate() {
        if *keep == Keep::Extra && !empty(i) {
            match same(i) && rows.len() > 1 {
                true => shared.push(format!("{name} {}", rows[0][i])),
                false if kept.len() < MAX_COLUMNS => kept.push(i),
                false => {}
            }
        }
    }
    kept.truncate(MAX_COLUMNS);
    let mut md = String::new();
    if !shared.is_empty() {
        let _ = writeln!(md, "Every run: {}.\n", shared.join(" · "));
    }
    let header: Vec<&str> = kept.iter().map(|&i| columns[i].0).collect();
    let _ = writeln!(md, "| {} |", header.join(" | "));
    let _ = writeln!(md, "|{}", "---|".repeat(kept.len()));
    for row in rows {
        let cells: Vec<&str> = kept.iter().map(|&i| row[i].as_str()).collect();
        let _ = writeln!(md, "| {} |", cells.join(" | "));
    }
    if !unshown.is_empty() {
        let _ = writeln!(
            md,
            "\nAlso differing between these runs (in each run's config): {}.",
            unshown.join(", ")
        );
    }
    let files: Vec<usize> = (0..columns.len())
        .filter(|&i| columns[i].1 == Keep::File && !empty(i))
        .collect();
    if !files.is_empty() {
        let _ = writeln!(md);
        for row in rows {
            let listed: Vec<String> = files
                .iter()
                .filter(|&&i| row[i] != EMPTY)
                .map(|&i| format!("{} {}", columns[i].0, row[i]))
                .collect();
            if !listed.is_empty() {
                let _ = writeln!(md, "- {}: {}", row[0], listed.join(", "));
            }
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|c| c.to_string()).collect()
    }

    /// Shared settings go above the table, differing ones into it, empty columns nowhere, paths under it.
    #[test]
    fn a_person_reads_what_differs() {
        let columns = [
            ("run", Keep::Key),
            ("status", Keep::Key),
            ("model", Keep::Setting),
            ("global batch", Keep::Setting),
            ("val top-1", Keep::Key),
            ("peak GPU mem", Keep::Key),
            ("peak RSS", Keep::Extra),
            ("checkpoint", Keep::File),
        ];
        let rows = [
            row(&["a", "completed", "cnn", "32", "0.9", "–", "1 MiB", "`a.st`"]),
            row(&["b", "completed", "cnn", "64", "0.8", "–", "1 MiB", "–"]),
        ];
        let md = render(&columns, &rows);
        assert!(
            md.starts_with("Every run: model cnn · peak RSS 1 MiB.\n"),
            "{md}"
        );
        assert!(
            md.contains("| run | status | global batch | val top-1 |\n"),
            "{md}"
        );
        assert!(md.contains("| a | completed | 32 | 0.9 |"), "{md}");
        assert!(
            md.contains("- a: checkpoint `a.st`\n") && !md.contains("- b:"),
            "{md}"
        );
    }

    /// However many columns differ, the table stays within `MAX_COLUMNS`.
    #[test]
    fn the_table_fits_a_screen() {
        let columns: Vec<(&str, Keep)> = std::iter::once(("run", Keep::Key))
            .chain((0..30).map(|_| ("x", Keep::Extra)))
            .collect();
        let rows = [
            row(&["a"; 31]),
            std::iter::once("b".to_string())
                .chain((0..30).map(|i| i.to_string()))
                .collect(),
        ];
        let md = render(&columns, &rows);
        let header = md.lines().next().unwrap();
        assert_eq!(header.matches(" | ").count() + 1, MAX_COLUMNS, "{header}");
    }

    /// Many differing settings do not push the numbers out: the settings that do not fit are named.
    #[test]
    fn the_numbers_keep_their_place() {
        let mut columns: Vec<(&str, Keep)> = vec![("run", Keep::Key), ("status", Keep::Key)];
        columns.extend((0..20).map(|_| ("setting", Keep::Setting)));
        columns.push(("val top-1", Keep::Key));
        let rows = [
            std::iter::once("a".to_string())
                .chain(std::iter::once("completed".to_string()))
                .chain((0..20).map(|i| i.to_string()))
                .chain(std::iter::once("0.5".to_string()))
                .collect::<Vec<_>>(),
            std::iter::once("b".to_string())
                .chain(std::iter::once("completed".to_string()))
                .chain((0..20).map(|i| (i + 1).to_string()))
                .chain(std::iter::once("0.6".to_string()))
                .collect::<Vec<_>>(),
        ];
        let md = render(&columns, &rows);
        let header = md.lines().next().unwrap();
        assert!(header.ends_with("| val top-1 |"), "{header}");
        assert_eq!(header.matches(" | ").count() + 1, MAX_COLUMNS, "{header}");
        assert!(md.contains("Also differing between these runs"), "{md}");
    }
}
