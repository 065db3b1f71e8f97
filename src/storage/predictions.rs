//! `train predict`'s output: one row per input, as CSV or parquet (by the file's extension), written
//! atomically. Columns: `index` (the sample's place in its split), `id` where the data set names its
//! samples (a file's path, a WebDataset key), then the task's: `target`, `pred`, `prob` for
//! classification; `target`, `value` (or `target_<i>`, `value_<i>` for several outputs) for values.

use anyhow::Context;
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use std::path::Path;
use std::sync::Arc;

/// A numeric column: whole numbers (index, class) or reals (probability, value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Real,
}

/// The predicted rows, column by column: `numbers[c][r]` is row `r` of numeric column `c`.
#[derive(Debug, Default)]
pub struct Table {
    /// One per row when the data set names its samples; else empty (no `id` column).
    pub ids: Vec<String>,
    pub columns: Vec<(String, Kind)>,
    pub numbers: Vec<Vec<f64>>,
}

impl Table {
    pub fn rows(&self) -> usize {
        self.numbers.first().map_or(0, Vec::len)
    }

    /// Write to `path` (`.parquet`, else CSV) through a temporary file in its folder.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let parquet = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
        let bytes = match parquet {
            true => self.parquet()?,
            false => self.csv().into_bytes(),
        };
        super::records::write_atomic(path, &bytes)
            .with_context(|| format!("writing the predictions to {}", path.display()))
    }

    /// Header names in file order: `index`, then `id` (if any), then the rest.
    fn header(&self) -> Vec<&str> {
        let mut names: Vec<&str> = vec![self.columns[0].0.as_str()];
        if !self.ids.is_empty() {
            names.push("id");
        }
        names.extend(self.columns[1..].iter().map(|(n, _)| n.as_str()));
        names
    }

    fn csv(&self) -> String {
        let mut out = self.header().join(",");
        out.push('\n');
        for r in 0..self.rows() {
            let mut cells = vec![format_number(self.numbers[0][r], self.columns[0].1)];
            if let Some(id) = self.ids.get(r) {
                cells.push(csv_field(id));
            }
            for (c, (_, kind)) in self.columns.iter().enumerate().skip(1) {
                cells.push(format_number(self.numbers[c][r], *kind));
            }
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    fn parquet(&self) -> anyhow::Result<Vec<u8>> {
        let field = |name: &str, kind: Kind| match kind {
            Kind::Int => format!("required int64 {name};"),
            Kind::Real => format!("required double {name};"),
        };
        let mut fields = vec![field(&self.columns[0].0, self.columns[0].1)];
        if !self.ids.is_empty() {
            fields.push("required binary id (UTF8);".into());
        }
        fields.extend(self.columns[1..].iter().map(|(n, k)| field(n, *k)));
        let message = format!("message predictions {{ {} }}", fields.join(" "));
        let schema = Arc::new(parquet::schema::parser::parse_message_type(&message)?);
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .build(),
        );
        let mut bytes = Vec::new();
        let mut writer = SerializedFileWriter::new(&mut bytes, schema, props)?;
        let mut group = writer.next_row_group()?;
        let mut order: Vec<Option<usize>> = vec![Some(0)];
        if !self.ids.is_empty() {
            order.push(None);
        }
        order.extend((1..self.columns.len()).map(Some));
        for column in order {
            let mut out = group
                .next_column()?
                .context("parquet: fewer columns than the schema")?;
            match column {
                None => {
                    let ids: Vec<ByteArray> = self
                        .ids
                        .iter()
                        .map(|s| ByteArray::from(s.as_str()))
                        .collect();
                    out.typed::<ByteArrayType>().write_batch(&ids, None, None)?;
                }
                Some(c) if self.columns[c].1 == Kind::Int => {
                    let values: Vec<i64> = self.numbers[c].iter().map(|v| *v as i64).collect();
                    out.typed::<Int64Type>().write_batch(&values, None, None)?;
                }
                Some(c) => {
                    out.typed::<DoubleType>()
                        .write_batch(&self.numbers[c], None, None)?;
                }
            }
            out.close()?;
        }
        group.close()?;
        writer.close()?;
        Ok(bytes)
    }
}

fn format_number(v: f64, kind: Kind) -> String {
    match kind {
        Kind::Int => format!("{}", v as i64),
        Kind::Real => format!("{v}"),
    }
}

/// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
fn csv_field(s: &str) -> String {
    match s.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", s.replace('"', "\"\"")),
        false => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    fn table() -> Table {
        Table {
            ids: vec!["a,1.png".into(), "b\"2.png".into()],
            columns: vec![
                ("index".into(), Kind::Int),
                ("pred".into(), Kind::Int),
                ("prob".into(), Kind::Real),
            ],
            numbers: vec![vec![3.0, 7.0], vec![1.0, 0.0], vec![0.5, 0.25]],
        }
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        assert_eq!(
            table().csv(),
            "index,id,pred,prob\n3,\"a,1.png\",1,0.5\n7,\"b\"\"2.png\",0,0.25\n"
        );
    }

    #[test]
    fn parquet_reads_back_row_by_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        table().write(&path).unwrap();
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let rows: Vec<String> = reader
            .get_row_iter(None)
            .unwrap()
            .map(|r| r.unwrap().to_string())
            .collect();
        assert_eq!(
            rows,
            [
                "{index: 3, id: \"a,1.png\", pred: 1, prob: 0.5}",
                "{index: 7, id: \"b\"2.png\", pred: 0, prob: 0.25}"
            ]
        );
    }
}
