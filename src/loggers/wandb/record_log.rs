//! W&B's transaction log (`run-<id>.wandb`): a LevelDB-style record log. A 7-byte file header (`:W&B`,
//! magic 0xBEE1 little-endian, version 0), then records cut into chunks that never cross a 32 KiB block:
//! each chunk is a 7-byte header (zlib CRC-32 of the type byte and the data, little-endian; the data's
//! length, u16; the type: FULL, or FIRST/MIDDLE/LAST for a record split across blocks) and its data. A
//! block's tail too short for a chunk header is zero-filled. The data are protobuf `Record`s.

use std::fs::File;
use std::io::Write;
use std::path::Path;

pub const BLOCK: u64 = 32 * 1024;
const CHUNK_HEADER: u64 = 7;
const FILE_HEADER: [u8; 7] = [b':', b'W', b'&', b'B', 0xE1, 0xBE, 0];

#[derive(Clone, Copy)]
#[repr(u8)]
enum ChunkType {
    Full = 1,
    First = 2,
    Middle = 3,
    Last = 4,
}

pub struct RecordLog {
    file: File,
    /// Bytes written so far (the file header included: blocks count from the file's start).
    offset: u64,
}

impl RecordLog {
    pub fn create(path: &Path) -> std::io::Result<RecordLog> {
        let mut file = File::create(path)?;
        file.write_all(&FILE_HEADER)?;
        Ok(RecordLog {
            file,
            offset: FILE_HEADER.len() as u64,
        })
    }

    /// Append one record, chunked across blocks; written through (no buffer to lose in a crash).
    pub fn append(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(data.len() + 64);
        let mut rest = data;
        let mut first = true;
        loop {
            let room = BLOCK - self.offset % BLOCK;
            if room < CHUNK_HEADER {
                out.extend(std::iter::repeat_n(0u8, room as usize));
                self.offset += room;
                continue;
            }
            let n = rest.len().min((room - CHUNK_HEADER) as usize);
            let last = n == rest.len();
            let kind = match (first, last) {
                (true, true) => ChunkType::Full,
                (true, false) => ChunkType::First,
                (false, true) => ChunkType::Last,
                (false, false) => ChunkType::Middle,
            };
            let (chunk, tail) = rest.split_at(n);
            let mut crc = crc32fast::Hasher::new();
            crc.update(&[kind as u8]);
            crc.update(chunk);
            out.extend(crc.finalize().to_le_bytes());
            out.extend((n as u16).to_le_bytes());
            out.push(kind as u8);
            out.extend(chunk);
            self.offset += CHUNK_HEADER + n as u64;
            rest = tail;
            first = false;
            if last {
                break;
            }
        }
        self.file.write_all(&out)
    }

    pub fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// Read the records back, checking every chunk (what W&B's reader does).
    pub fn read_records(bytes: &[u8]) -> Vec<Vec<u8>> {
        assert_eq!(&bytes[..7], &FILE_HEADER);
        let (mut at, mut records, mut partial) = (7usize, Vec::new(), Vec::new());
        while at < bytes.len() {
            let room = (BLOCK as usize) - at % BLOCK as usize;
            if room < 7 {
                assert!(bytes[at..at + room].iter().all(|&b| b == 0));
                at += room;
                continue;
            }
            let crc = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            let len = u16::from_le_bytes(bytes[at + 4..at + 6].try_into().unwrap()) as usize;
            let kind = bytes[at + 6];
            let data = &bytes[at + 7..at + 7 + len];
            let mut h = crc32fast::Hasher::new();
            h.update(&[kind]);
            h.update(data);
            assert_eq!(h.finalize(), crc, "chunk at {at}");
            partial.extend_from_slice(data);
            if kind == 1 || kind == 4 {
                records.push(std::mem::take(&mut partial));
            }
            at += 7 + len;
        }
        records
    }

    #[test]
    fn records_split_across_blocks_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.wandb");
        let mut log = RecordLog::create(&path).unwrap();
        // Small ones, one that leaves a block's tail under 7 bytes, and one spanning three blocks.
        let records: Vec<Vec<u8>> = vec![
            vec![1; 10],
            vec![2; (BLOCK as usize) - 24 - 7 - 3],
            vec![3; 5],
            (0..80_000u32).map(|i| (i % 251) as u8).collect(),
            vec![],
            vec![5; 1],
        ];
        for r in &records {
            log.append(r).unwrap();
        }
        drop(log);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(read_records(&bytes), records);
        assert!(bytes.len() > 2 * BLOCK as usize);
    }
}
