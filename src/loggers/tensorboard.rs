//! TensorBoard event files (`events.out.tfevents.*`): TFRecord framing (length, masked CRC-32C of the
//! length, the `Event` protobuf, masked CRC-32C of the data) around `Event`/`Summary` messages encoded with
//! prost. TensorBoard's own reader loads them (tested in CI against the `tensorboard` Python package).

use anyhow::Context;
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// TFRecord's CRC: CRC-32C, rotated and offset so that CRCs of CRCs stay well distributed.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

pub struct TensorBoardWriter {
    file: std::io::BufWriter<std::fs::File>,
    pub path: PathBuf,
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl TensorBoardWriter {
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "localhost".into());
        let name = format!(
            "events.out.tfevents.{}.{}.{}",
            now() as u64,
            host.trim(),
            std::process::id()
        );
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        let mut w = TensorBoardWriter {
            file: std::io::BufWriter::new(file),
            path,
        };
        w.write_event(&Event {
            wall_time: now(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(w)
    }

    fn write_event(&mut self, event: &Event) -> std::io::Result<()> {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        self.file.write_all(&len)?;
        self.file.write_all(&masked_crc(&len).to_le_bytes())?;
        self.file.write_all(&data)?;
        self.file.write_all(&masked_crc(&data).to_le_bytes())?;
        self.file.flush()
    }

    /// Scalars for one step, in one event.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> std::io::Result<()> {
        let value = values
            .iter()
            .map(|(tag, v)| SummaryValue {
                tag: tag.to_string(),
                simple_value: Some(*v as f32),
            })
            .collect();
        self.write_event(&Event {
            wall_time: now(),
            step: step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })
    }
}

/// TensorBoard as a metric sink: every row's scalars at its step. With the learning rate logged per
/// step (`LearningRateMonitor(logging_interval="step")`), an epoch row's `lr` would repeat the last
/// step's value and is left out.
pub struct TensorBoardSink {
    pub writer: TensorBoardWriter,
    pub lr_each_step: bool,
}

impl super::MetricSink for TensorBoardSink {
    fn log(&mut self, row: &super::Row) -> anyhow::Result<()> {
        let values: Vec<(&str, f64)> = row
            .values
            .iter()
            .filter(|(k, _)| {
                !(self.lr_each_step && row.kind == super::RowKind::Epoch && *k == "lr")
            })
            .copied()
            .collect();
        self.writer
            .scalars(row.step, &values)
            .with_context(|| format!("could not write {}", self.writer.path.display()))
    }
}

/// Read an event file back, checking every CRC (tests do; TensorBoard's own reader is tested in CI).
#[cfg(test)]
fn read_events(path: &Path) -> anyhow::Result<Vec<Event>> {
    let bytes = std::fs::read(path)?;
    let mut out = Vec::new();
    let mut at = 0;
    let u32_at =
        |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    while at < bytes.len() {
        anyhow::ensure!(
            at + 12 <= bytes.len(),
            "{}: truncated record header at byte {at}",
            path.display()
        );
        let len_bytes = &bytes[at..at + 8];
        let len = u64::from_le_bytes(len_bytes.try_into()?) as usize;
        anyhow::ensure!(
            u32_at(at + 8) == masked_crc(len_bytes),
            "{}: bad length CRC at byte {at}",
            path.display()
        );
        let start = at + 12;
        anyhow::ensure!(
            start + len + 4 <= bytes.len(),
            "{}: truncated record at byte {at}",
            path.display()
        );
        let data = &bytes[start..start + len];
        anyhow::ensure!(
            u32_at(start + len) == masked_crc(data),
            "{}: bad data CRC at byte {at}",
            path.display()
        );
        out.push(Event::decode(data)?);
        at = start + len + 4;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_tfrecord_reference() {
        // From TensorFlow's crc32c tests: crc32c("123456789") = 0xe3069283.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // The masked form, worked out by hand: ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2^32).
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn write_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TensorBoardWriter::create(dir.path()).unwrap();
        w.scalars(3, &[("train/loss", 1.5), ("lr", 0.1)]).unwrap();
        w.scalars(4, &[("val/acc1", 0.25)]).unwrap();
        let events = read_events(&w.path).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        let s = events[1].summary.as_ref().unwrap();
        assert_eq!(
            (
                events[1].step,
                s.value[0].tag.as_str(),
                s.value[0].simple_value
            ),
            (3, "train/loss", Some(1.5))
        );
        // A flipped byte is caught.
        let mut bytes = std::fs::read(&w.path).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        std::fs::write(&w.path, bytes).unwrap();
        assert!(read_events(&w.path).is_err());
    }
}
