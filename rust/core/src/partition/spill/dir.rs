//! [`SpillDir`]: the directory one environment spills into, the disk budget (`max_spill`)
//! shared by its partitions, and the clean-up of directories whose process died.
//!
//! Layout under the configured root (`spill_dir`):
//!
//! ```text
//! <root>/<pid>-<nonce>.lock   held with an exclusive file lock while the owner lives
//! <root>/<pid>-<nonce>/       the owner's spill files
//! ```
//!
//! The OS drops a file lock when its process exits, however it exits (SIGKILL included), so
//! a `.lock` file that can be locked belongs to a dead owner: the next environment that opens
//! the same root removes that directory. A directory without its `.lock` file is also dead
//! (the lock file is created and locked before the directory, and removed after it). Pid
//! numbers are only part of the name: a reused pid does not make a dead directory look alive.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::base::error::{Error, Result};
use crate::base::metrics::Counter;

/// The subdirectory of the system temp dir used when no `spill_dir` is configured.
pub const DEFAULT_ROOT_NAME: &str = "creditflow-spill";

/// The directories of this process, for [`remove_all`] at exit.
static LIVE: Mutex<Vec<Weak<SpillDir>>> = Mutex::new(Vec::new());

/// Removes every spill directory of this process that still exists (the interpreter exits
/// with environments open). Their environments' partitions fail on their next spill.
pub fn remove_all() {
    let dirs: Vec<Arc<SpillDir>> = {
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.iter().filter_map(Weak::upgrade).collect()
    };
    for d in dirs {
        d.remove();
    }
}

/// One environment's spill directory.
#[derive(Debug)]
pub struct SpillDir {
    root: PathBuf,
    path: PathBuf,
    lock_path: PathBuf,
    /// Held (locked) for the directory's lifetime.
    _lock: File,
    /// Bytes in spill files now (against `limit`).
    used: AtomicU64,
    /// `max_spill`: bytes the files may hold together.
    limit: u64,
    next_file: AtomicU64,
    /// Files created / bytes ever written (metrics).
    files_created: Counter,
    bytes_written: Counter,
    /// Directories of dead processes removed when this one was opened.
    swept: usize,
}

/// A snapshot of an environment's spill directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillDirMetrics {
    /// The environment's own directory.
    pub path: String,
    /// Bytes the spill files hold now.
    pub disk_bytes: u64,
    /// `max_spill` (`None`: unbounded).
    pub max_spill: Option<u64>,
    /// Bytes ever written to spill files.
    pub written_bytes: u64,
    /// Spill files ever created.
    pub files_created: u64,
    /// Directories of dead processes removed when this one was opened.
    pub swept_dirs: usize,
}

impl SpillDir {
    /// Opens a new directory under `root` (default: `<temp dir>/creditflow-spill`), after
    /// removing the directories of processes that died. `limit` caps the bytes all files in
    /// it may hold (`None`: unbounded).
    pub fn open(root: Option<&Path>, limit: Option<u64>) -> Result<Arc<SpillDir>> {
        let root = match root {
            Some(r) => r.to_path_buf(),
            None => std::env::temp_dir().join(DEFAULT_ROOT_NAME),
        };
        std::fs::create_dir_all(&root).map_err(|e| io_error(&root, "create the spill directory", &e))?;
        let swept = sweep(&root);
        let pid = std::process::id();
        for _ in 0..16 {
            let mut nonce = [0u8; 8];
            getrandom::fill(&mut nonce).map_err(|e| Error::Spill(format!("random name: {e}")))?;
            let name = format!("{pid}-{:016x}", u64::from_le_bytes(nonce));
            let lock_path = root.join(format!("{name}.lock"));
            let lock = match OpenOptions::new().write(true).create_new(true).open(&lock_path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_error(&root, "create a lock file in", &e)),
            };
            lock.try_lock()
                .map_err(|e| Error::Spill(format!("could not lock {}: {e}", lock_path.display())))?;
            // Another environment's sweep may have locked and removed the file between its
            // creation and our lock: then ours is not the file at that path any more.
            if !same_file(&lock, &lock_path) {
                continue;
            }
            let path = root.join(&name);
            std::fs::create_dir(&path).map_err(|e| io_error(&root, "create a directory in", &e))?;
            let dir = Arc::new(SpillDir {
                root,
                path,
                lock_path,
                _lock: lock,
                used: AtomicU64::new(0),
                limit: limit.unwrap_or(u64::MAX),
                next_file: AtomicU64::new(0),
                files_created: Counter::default(),
                bytes_written: Counter::default(),
                swept,
            });
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&dir));
            return Ok(dir);
        }
        Err(Error::Spill(format!(
            "could not create a spill directory under {}",
            root.display()
        )))
    }

    /// This environment's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configured root (`spill_dir`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directories of dead processes removed when this one was opened.
    pub fn swept(&self) -> usize {
        self.swept
    }

    /// A new file path in the directory (`<stem>-<n>.spill`).
    pub(crate) fn new_file_path(&self, stem: &str) -> PathBuf {
        let n = self.next_file.fetch_add(1, Ordering::Relaxed);
        let safe: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        self.files_created.add(1);
        self.path.join(format!("{safe}-{n}.spill"))
    }

    /// Takes `bytes` of the disk budget; [`Error::Spill`] naming `max_spill` if they do not fit.
    pub(crate) fn reserve(&self, bytes: u64) -> Result<()> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.saturating_add(bytes);
            if next > self.limit {
                return Err(Error::Spill(format!(
                    "spilling {bytes} more bytes to {} would exceed max_spill ({} bytes; {used} in use): \
                     raise `max_spill` of the NetworkEnvironment, or release partitions that were read",
                    self.path.display(),
                    self.limit
                )));
            }
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    /// Counts `bytes` reserved with [`SpillDir::reserve`] as written.
    pub(crate) fn wrote(&self, bytes: u64) {
        self.bytes_written.add(bytes);
    }

    /// Gives `bytes` of the disk budget back (a file was removed, or a write failed).
    pub(crate) fn unreserve(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes in spill files now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// `max_spill` (`u64::MAX`: unbounded).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Spill files created so far.
    pub fn files_created(&self) -> u64 {
        self.files_created.get()
    }

    /// Bytes ever written to spill files.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.get()
    }

    /// A snapshot of the numbers.
    pub fn metrics(&self) -> SpillDirMetrics {
        SpillDirMetrics {
            path: self.path.display().to_string(),
            disk_bytes: self.used(),
            max_spill: (self.limit != u64::MAX).then_some(self.limit),
            written_bytes: self.bytes_written(),
            files_created: self.files_created(),
            swept_dirs: self.swept,
        }
    }
}

impl SpillDir {
    /// Removes the directory and everything in it (the environment closes; files still
    /// open are unlinked). Idempotent; dropping the last handle does it too.
    pub fn remove(&self) {
        // Directory first, lock file last: a directory without its lock file is dead.
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!(
                    "creditflow: could not remove spill directory {}: {e}",
                    self.path.display()
                );
            }
        }
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A spill error for an I/O failure on `dir`.
pub(crate) fn io_error(dir: &Path, what: &str, e: &std::io::Error) -> Error {
    Error::Spill(format!("could not {what} {}: {e}", dir.display()))
}

fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Removes the directories under `root` whose owner died; returns how many.
fn sweep(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    let mut dirs = Vec::new();
    let mut locks = std::collections::HashSet::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_owner_name(name.trim_end_matches(".lock")) {
            continue; // not ours: never touch it
        }
        if let Some(stem) = name.strip_suffix(".lock") {
            locks.insert(stem.to_string());
            let path = entry.path();
            let Ok(file) = OpenOptions::new().write(true).open(&path) else {
                continue;
            };
            if file.try_lock().is_ok() {
                // Its owner is gone: remove the directory, then the lock file (still held, so
                // no other sweep removes them at the same time).
                let dir = root.join(stem);
                if dir.exists() && std::fs::remove_dir_all(&dir).is_err() {
                    continue;
                }
                let _ = std::fs::remove_file(&path);
                locks.remove(stem);
                removed += 1;
                log::info!(
                    "creditflow: removed the spill files of a dead process in {}",
                    dir.display()
                );
            }
        } else if entry.path().is_dir() {
            dirs.push(name);
        }
    }
    for name in dirs {
        if !locks.contains(&name)
            && !root.join(format!("{name}.lock")).exists()
            && std::fs::remove_dir_all(root.join(&name)).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Whether `name` is `<pid>-<16 hex digits>`, the form this module creates.
fn is_owner_name(name: &str) -> bool {
    match name.split_once('-') {
        Some((pid, nonce)) => {
            !pid.is_empty()
                && pid.bytes().all(|b| b.is_ascii_digit())
                && nonce.len() == 16
                && nonce.bytes().all(|b| b.is_ascii_hexdigit())
        }
        None => false,
    }
}
