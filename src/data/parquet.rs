//! Datasets as the Hugging Face hub publishes them (`data=parquet`): parquet files named by split
//! (`train-00000-of-00004.parquet`, `test-...`, `validation-...`, directly under `root` or in a
//! subdirectory such as `plain_text/` or `data/`; or the converter's `<split>/0000.parquet`), each row an
//! image — a struct `{bytes, path}` as `datasets`' `Image` feature writes it, or raw bytes — and an integer
//! label. Class names come from the files' `huggingface` metadata when it has them.
//!
//! Labels are read once when the split opens (a column of integers); images stay encoded in the files
//! and are read a row group at a time, the encoded bytes of recent row groups kept in memory up to
//! `CACHE_BYTES` (the whole of CIFAR-10 or MNIST fits, so each row group is read once). Files on S3
//! (`root: s3://bucket/prefix`, feature `s3`) are copied to the local cache first (`s3_cache`).

use super::{DataError, Dataset, Image, Split};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use parquet::schema::types::Type;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Encoded image bytes kept in memory, at most (row groups read least recently are dropped first).
const CACHE_BYTES: usize = 2 << 30;

/// What `data.*` says about the files.
#[derive(Debug, Clone)]
pub struct Columns {
    /// The image column; `None`: `image` or `img`, whichever the files have (the hub's MNIST and
    /// CIFAR-10 name it so).
    pub image: Option<String>,
    pub label: String,
}

/// The image column names looked for when `data.image_column` is not set.
const IMAGE_COLUMNS: &[&str] = &["image", "img"];

/// One row group of one file, and where its rows start in the split.
#[derive(Debug, Clone)]
struct Part {
    file: usize,
    row_group: usize,
    start: usize,
    rows: usize,
}

pub struct ParquetDataset {
    files: Vec<PathBuf>,
    parts: Vec<Part>,
    labels: Vec<u32>,
    classes: usize,
    names: Option<Vec<String>>,
    channels: usize,
    image_column: String,
    cache: Mutex<RowGroupCache>,
}

impl ParquetDataset {
    /// The split's files under `root` (a local directory), their labels read and checked against
    /// `num_classes`.
    pub fn open(
        root: &Path,
        split: Split,
        columns: &Columns,
        num_classes: usize,
        channels: usize,
    ) -> Result<Self, DataError> {
        let files = split_files(root, split)?;
        let mut parts = Vec::new();
        let mut labels = Vec::new();
        let mut names: Option<(PathBuf, Vec<String>)> = None;
        let mut image_column: Option<String> = columns.image.clone();
        for (index, path) in files.iter().enumerate() {
            let reader = open_file(path)?;
            let meta = reader.metadata();
            let schema = meta.file_metadata().schema();
            let label_field = column(path, schema, &columns.label, "data.label_column")?;
            let image = match &image_column {
                Some(name) => name.clone(),
                None => IMAGE_COLUMNS
                    .iter()
                    .find(|n| schema.get_fields().iter().any(|f| f.name() == **n))
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| IMAGE_COLUMNS[0].to_string()),
            };
            column(path, schema, &image, "data.image_column")?;
            image_column.get_or_insert(image);
            if let Some(found) =
                class_names(meta.file_metadata().key_value_metadata(), &columns.label)
            {
                names.get_or_insert((path.clone(), found));
            }
            for row_group in 0..meta.num_row_groups() {
                let rows = meta.row_group(row_group).num_rows() as usize;
                parts.push(Part {
                    file: index,
                    row_group,
                    start: labels.len(),
                    rows,
                });
                let group = reader
                    .get_row_group(row_group)
                    .map_err(|e| DataError::corrupt(path, format!("row group {row_group}: {e}")))?;
                let projection = projection(label_field.clone());
                let iter = group
                    .get_row_iter(Some(projection))
                    .map_err(|e| DataError::corrupt(path, format!("row group {row_group}: {e}")))?;
                for row in iter {
                    let row = row.map_err(|e| {
                        DataError::corrupt(path, format!("row group {row_group}: {e}"))
                    })?;
                    let label = label_of(&row, &columns.label)
                        .and_then(|l| check_label(l, num_classes, &columns.label))
                        .map_err(|m| {
                            let at = labels.len() - parts.last().map_or(0, |p: &Part| p.start);
                            DataError::corrupt(
                                path,
                                format!("row {at} of row group {row_group}: {m}"),
                            )
                        })?;
                    labels.push(label);
                }
                let read = labels.len() - parts.last().map_or(0, |p: &Part| p.start);
                if read != rows {
                    return Err(DataError::corrupt(
                        path,
                        format!("row group {row_group}: its metadata says {rows} rows, {read} were read"),
                    ));
                }
            }
        }
        if labels.is_empty() {
            return Err(DataError::corrupt(
                root,
                "the split's parquet files hold no rows",
            ));
        }
        if let Some((path, found)) = &names {
            if found.len() != num_classes {
                return Err(DataError::corrupt(
                    path,
                    format!(
                        "its metadata names {} classes for '{}' but data.num_classes={num_classes}; set \
                         data.num_classes={}",
                        found.len(),
                        columns.label,
                        found.len()
                    ),
                ));
            }
        }
        Ok(ParquetDataset {
            files,
            parts,
            labels,
            classes: num_classes,
            names: names.map(|(_, n)| n),
            channels,
            image_column: image_column.expect("set from the first file"),
            cache: Mutex::new(RowGroupCache::default()),
        })
    }

    /// The class names from the hub's metadata (`ClassLabel`'s `names`), when the files carry them.
    pub fn class_names(&self) -> Option<&[String]> {
        self.names.as_deref()
    }

    /// The encoded images of one row group, from the cache or read now.
    fn row_group(&self, part: usize) -> Result<Arc<Vec<Vec<u8>>>, DataError> {
        if let Some(hit) = self.cache.lock().expect("cache lock").get(part) {
            return Ok(hit);
        }
        let Part {
            file, row_group, ..
        } = self.parts[part];
        let path = &self.files[file];
        let reader = open_file(path)?;
        let schema = reader.metadata().file_metadata().schema();
        let field = column(path, schema, &self.image_column, "data.image_column")?;
        let group = reader
            .get_row_group(row_group)
            .map_err(|e| DataError::corrupt(path, format!("row group {row_group}: {e}")))?;
        let iter = group
            .get_row_iter(Some(projection(field)))
            .map_err(|e| DataError::corrupt(path, format!("row group {row_group}: {e}")))?;
        let mut images = Vec::with_capacity(self.parts[part].rows);
        for (offset, row) in iter.enumerate() {
            let row =
                row.map_err(|e| DataError::corrupt(path, format!("row group {row_group}: {e}")))?;
            let bytes = image_bytes(&row, &self.image_column).map_err(|m| {
                DataError::corrupt(path, format!("row {offset} of row group {row_group}: {m}"))
            })?;
            images.push(bytes);
        }
        let images = Arc::new(images);
        self.cache
            .lock()
            .expect("cache lock")
            .put(part, images.clone());
        Ok(images)
    }
}

impl ParquetDataset {
    /// Row `index`'s image bytes and class; its key names the row, row group and column for errors.
    fn row_bytes(&self, index: usize) -> Result<super::EncodedImage, DataError> {
        let part = self.parts.partition_point(|p| p.start + p.rows <= index);
        let images = self.row_group(part)?;
        let Part {
            file,
            start,
            row_group,
            ..
        } = self.parts[part];
        let path = &self.files[file];
        let row = index - start;
        let bytes = images.get(row).ok_or_else(|| {
            DataError::corrupt(
                path,
                format!("row group {row_group} ended before row {row}"),
            )
        })?;
        Ok(super::EncodedImage {
            bytes: bytes.to_vec(),
            label: self.labels[index],
            channels: self.channels,
            shard: path.display().to_string().into(),
            name: format!(
                "row {row} of row group {row_group}: column '{}'",
                self.image_column
            ),
        })
    }
}

impl Dataset for ParquetDataset {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn num_classes(&self) -> usize {
        self.classes
    }

    fn get(&self, index: usize) -> Result<Image, DataError> {
        self.row_bytes(index)?.decode()
    }

    /// The row's image bytes, for the loader's JPEG path (decoding only what the crop needs).
    fn encoded_image(&self, index: usize) -> Option<Result<super::EncodedImage, DataError>> {
        Some(self.row_bytes(index))
    }

    fn label(&self, index: usize) -> Option<Result<u32, DataError>> {
        Some(Ok(self.labels[index]))
    }

    fn encoded(&self, index: usize) -> Option<Result<(Vec<u8>, String), DataError>> {
        let part = self.parts.partition_point(|p| p.start + p.rows <= index);
        Some(self.row_group(part).and_then(|images| {
            let Part {
                file,
                start,
                row_group,
                ..
            } = self.parts[part];
            let bytes = images.get(index - start).cloned().ok_or_else(|| {
                DataError::corrupt(
                    &self.files[file],
                    format!("row group {row_group} ended before row {}", index - start),
                )
            })?;
            let ext = super::image_extension(&bytes);
            Ok((bytes, ext))
        }))
    }
}

/// The split's files: `<split>-*.parquet` or `<split>/*.parquet` anywhere under `root`, sorted. The
/// validation split is `validation` (or `valid`, `val`), else `test`; the test split `test`, else the
/// validation one.
fn split_files(root: &Path, split: Split) -> Result<Vec<PathBuf>, DataError> {
    if !root.is_dir() {
        return Err(DataError::Missing {
            name: "parquet dataset".into(),
            looked_for: root.display().to_string(),
            hint: "Point data.root at the dataset's directory (the hub's layout: \
                   train-00000-of-00001.parquet, test-..., possibly in a subdirectory)."
                .into(),
        });
    }
    let mut all = Vec::new();
    walk(root, &mut all).map_err(|e| DataError::corrupt(root, e.to_string()))?;
    let candidates: &[&str] = match split {
        Split::Train => &["train"],
        Split::Val => &["validation", "valid", "val", "test"],
        Split::Test => &["test", "validation", "valid", "val"],
    };
    for name in candidates {
        let mut found: Vec<PathBuf> = all.iter().filter(|p| of_split(p, name)).cloned().collect();
        if !found.is_empty() {
            found.sort();
            return Ok(found);
        }
    }
    Err(DataError::Missing {
        name: "parquet dataset".into(),
        looked_for: format!(
            "{} files named {}-*.parquet (or in a {}/ folder) under {}",
            match split {
                Split::Train => "training",
                Split::Val => "validation",
                Split::Test => "test",
            },
            candidates[0],
            candidates[0],
            root.display()
        ),
        hint: format!(
            "found {} parquet file(s) there; the hub names each file by its split \
             (train-00000-of-00001.parquet)",
            all.len()
        ),
    })
}

fn of_split(path: &Path, split: &str) -> bool {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let parent = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|s| s.to_str())
        .unwrap_or("");
    stem == split
        || stem.starts_with(&format!("{split}-"))
        || stem.starts_with(&format!("{split}."))
        || parent == split
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "parquet") {
            out.push(path);
        }
    }
    Ok(())
}

fn open_file(path: &Path) -> Result<SerializedFileReader<std::fs::File>, DataError> {
    let file = std::fs::File::open(path).map_err(|e| DataError::corrupt(path, e.to_string()))?;
    SerializedFileReader::new(file)
        .map_err(|e| DataError::corrupt(path, format!("not a readable parquet file: {e}")))
}

/// The top-level column `name` of `schema`, or an error naming the file, the key and the columns it has.
fn column(path: &Path, schema: &Type, name: &str, key: &str) -> Result<Arc<Type>, DataError> {
    let fields = schema.get_fields();
    if let Some(field) = fields.iter().find(|f| f.name() == name) {
        return Ok(field.clone());
    }
    let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
    let suggestion = names
        .iter()
        .map(|n| (strsim::jaro_winkler(n, name), *n))
        .filter(|(score, _)| *score > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, n)| format!(" (did you mean {key}={n}?)"))
        .unwrap_or_default();
    Err(DataError::corrupt(
        path,
        format!(
            "no column '{name}' ({key}); its columns are: {}{suggestion}",
            names.join(", ")
        ),
    ))
}

fn projection(field: Arc<Type>) -> Type {
    Type::group_type_builder("schema")
        .with_fields(vec![field])
        .build()
        .expect("a group of one existing column is a valid schema")
}

/// The label of a projected row: an integer column.
fn label_of(row: &Row, name: &str) -> Result<i64, String> {
    let (_, field) = row
        .get_column_iter()
        .next()
        .ok_or_else(|| format!("no value in column '{name}'"))?;
    match field {
        Field::Byte(v) => Ok(*v as i64),
        Field::Short(v) => Ok(*v as i64),
        Field::Int(v) => Ok(*v as i64),
        Field::Long(v) => Ok(*v),
        Field::UByte(v) => Ok(*v as i64),
        Field::UShort(v) => Ok(*v as i64),
        Field::UInt(v) => Ok(*v as i64),
        Field::ULong(v) => i64::try_from(*v).map_err(|_| format!("label {v} is out of range")),
        Field::Null => Err(format!("column '{name}' is null (an unlabelled row)")),
        other => Err(format!(
            "column '{name}' holds {other:?}, not an integer class (set data.label_column to the label's column)"
        )),
    }
}

fn check_label(label: i64, classes: usize, name: &str) -> Result<u32, String> {
    if label < 0 {
        return Err(format!(
            "label {label} in column '{name}': the hub marks rows without a label with -1 (a test split \
             published unlabelled); train and validate on labelled splits"
        ));
    }
    if label as usize >= classes {
        return Err(format!(
            "label {label} in column '{name}' is not below data.num_classes={classes}"
        ));
    }
    Ok(label as u32)
}

/// The encoded image of a projected row: `{bytes, path}` (`datasets`' Image feature) or raw bytes.
fn image_bytes(row: &Row, name: &str) -> Result<Vec<u8>, String> {
    let (_, field) = row
        .get_column_iter()
        .next()
        .ok_or_else(|| format!("no value in column '{name}'"))?;
    match field {
        Field::Bytes(b) => Ok(b.data().to_vec()),
        Field::Group(group) => {
            let mut path = None;
            for (key, value) in group.get_column_iter() {
                match (key.as_str(), value) {
                    ("bytes", Field::Bytes(b)) => return Ok(b.data().to_vec()),
                    ("path", Field::Str(p)) => path = Some(p.clone()),
                    _ => {}
                }
            }
            Err(match path {
                Some(p) => format!(
                    "column '{name}' holds only a path ({p}), not the image's bytes; publish the dataset \
                     with embedded images (datasets' push_to_hub / to_parquet embed them)"
                ),
                None => format!("column '{name}' is a struct without 'bytes'"),
            })
        }
        Field::Null => Err(format!("column '{name}' is null")),
        other => Err(format!(
            "column '{name}' holds {}, not an image (bytes, or a struct {{bytes, path}}); set \
             data.image_column to the image's column",
            field_kind(other)
        )),
    }
}

fn field_kind(field: &Field) -> &'static str {
    match field {
        Field::Str(_) => "strings",
        Field::Bool(_) => "booleans",
        Field::Float(_) | Field::Double(_) | Field::Float16(_) => "floats",
        Field::ListInternal(_) => "lists",
        Field::MapInternal(_) => "maps",
        _ => "numbers",
    }
}

/// `ClassLabel` names of `label` in the files' `huggingface` metadata (`info.features.<label>.names`).
fn class_names(
    meta: Option<&Vec<parquet::file::metadata::KeyValue>>,
    label: &str,
) -> Option<Vec<String>> {
    let value = meta?
        .iter()
        .find(|kv| kv.key == "huggingface")?
        .value
        .as_deref()?;
    let json: serde_json::Value = serde_json::from_str(value).ok()?;
    let names = json.pointer(&format!("/info/features/{label}/names"))?;
    names
        .as_array()?
        .iter()
        .map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// Recently read row groups' encoded images, the least recently used dropped first past `limit` bytes
/// (the newest is always kept).
struct RowGroupCache {
    groups: HashMap<usize, Arc<Vec<Vec<u8>>>>,
    order: VecDeque<usize>,
    bytes: usize,
    limit: usize,
}

impl Default for RowGroupCache {
    fn default() -> Self {
        RowGroupCache {
            groups: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            limit: CACHE_BYTES,
        }
    }
}

impl RowGroupCache {
    fn get(&mut self, part: usize) -> Option<Arc<Vec<Vec<u8>>>> {
        let hit = self.groups.get(&part).cloned()?;
        if let Some(at) = self.order.iter().position(|p| *p == part) {
            self.order.remove(at);
        }
        self.order.push_back(part);
        Some(hit)
    }

    fn put(&mut self, part: usize, images: Arc<Vec<Vec<u8>>>) {
        if self.groups.contains_key(&part) {
            return;
        }
        self.bytes += size_of(&images);
        self.groups.insert(part, images);
        self.order.push_back(part);
        while self.bytes > self.limit && self.order.len() > 1 {
            let oldest = self.order.pop_front().expect("not empty");
            if let Some(gone) = self.groups.remove(&oldest) {
                self.bytes -= size_of(&gone);
            }
        }
    }
}

fn size_of(images: &[Vec<u8>]) -> usize {
    images.iter().map(Vec::len).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(bytes: usize) -> Arc<Vec<Vec<u8>>> {
        Arc::new(vec![vec![0u8; bytes]])
    }

    /// Past its limit the cache drops the least recently used group; a hit makes a group recent.
    #[test]
    fn the_cache_drops_the_least_recently_used_group() {
        let mut cache = RowGroupCache {
            limit: 25,
            ..RowGroupCache::default()
        };
        cache.put(0, group(10));
        cache.put(1, group(10));
        assert!(cache.get(0).is_some());
        cache.put(2, group(10));
        assert!(cache.get(1).is_none(), "1 was the least recently used");
        assert!(cache.get(0).is_some() && cache.get(2).is_some());
        assert_eq!(cache.bytes, 20);
        cache.put(3, group(30));
        assert_eq!(
            (cache.groups.len(), cache.bytes),
            (1, 30),
            "the newest is kept alone"
        );
    }
}
