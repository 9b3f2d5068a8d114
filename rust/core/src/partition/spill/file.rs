//! [`SpillFile`]: one partition's append-only spill file. Written by the partition's writer,
//! read at offsets (`pread`) by any number of readers at once; removed when dropped.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::dir::SpillDir;
use crate::base::error::{Error, Result};

/// Where a spilled chunk lives in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Byte offset in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
    /// CRC-32 of the bytes, checked when they are read back.
    pub crc: u32,
}

/// An append-only file in a [`SpillDir`].
#[derive(Debug)]
pub struct SpillFile {
    dir: Arc<SpillDir>,
    path: PathBuf,
    file: File,
    /// End of the data written (appends go here; the writer is serialized by its caller).
    end: AtomicU64,
}

impl SpillFile {
    /// Creates a new file in `dir` named after `stem`.
    pub fn create(dir: &Arc<SpillDir>, stem: &str) -> Result<SpillFile> {
        let path = dir.new_file_path(stem);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::Spill(format!("could not create spill file {}: {e}", path.display())))?;
        Ok(SpillFile {
            dir: dir.clone(),
            path,
            file,
            end: AtomicU64::new(0),
        })
    }

    /// Appends `data` (at most 4 GiB); takes its bytes from the directory's budget first,
    /// so a write that would pass `max_spill` fails before anything is written. Callers
    /// append one at a time.
    pub fn append(&self, data: &[u8]) -> Result<Extent> {
        let len = data.len() as u64;
        let len32 = u32::try_from(data.len())
            .map_err(|_| Error::Spill(format!("a spilled chunk of {len} bytes is over 4 GiB")))?;
        self.dir.reserve(len)?;
        let offset = self.end.load(Ordering::Acquire);
        if let Err(e) = self.file.write_all_at(data, offset) {
            self.dir.unreserve(len);
            return Err(Error::Spill(format!(
                "could not write {len} bytes to spill file {} (at offset {offset}, {} bytes in the directory): {e}",
                self.path.display(),
                self.dir.used()
            )));
        }
        self.end.store(offset + len, Ordering::Release);
        self.dir.wrote(len);
        Ok(Extent {
            offset,
            len: len32,
            crc: crc32fast::hash(data),
        })
    }

    /// Reads the chunk at `extent` into `buf` (cleared first) and checks its checksum.
    pub fn read(&self, extent: Extent, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        buf.resize(extent.len as usize, 0);
        self.file.read_exact_at(buf, extent.offset).map_err(|e| {
            Error::Spill(format!(
                "could not read {} bytes at offset {} of spill file {}: {e}",
                extent.len,
                extent.offset,
                self.path.display()
            ))
        })?;
        if crc32fast::hash(buf) != extent.crc {
            return Err(Error::Spill(format!(
                "spill file {} is corrupt: the {} bytes at offset {} are not the bytes written there \
                 (checksum mismatch)",
                self.path.display(),
                extent.len,
                extent.offset
            )));
        }
        Ok(())
    }

    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        self.dir.unreserve(self.len());
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!(
                    "creditflow: could not remove spill file {}: {e}",
                    self.path.display()
                );
            }
        }
    }
}
