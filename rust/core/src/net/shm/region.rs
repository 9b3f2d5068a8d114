//! A region of memory two processes share: an anonymous `memfd` (no name in any file system,
//! so only a process given its descriptor can map it), sealed at its size so neither side can
//! shrink it under the other's mapping, and mapped shared.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// A shared mapping, unmapped when dropped. The descriptor is not kept: the mapping keeps the
/// memory alive, and it goes when both processes have unmapped it (or ended).
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory; every access to it goes through the atomics and the
// single-producer single-consumer discipline of `ring`, which is what makes sharing it sound.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// A new zero-filled region of `len` bytes and its descriptor (to pass to the peer).
    pub(crate) fn create(len: usize) -> std::io::Result<(Region, OwnedFd)> {
        let fd = rustix::fs::memfd_create("creditflow-shm", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let region = Region::map_fd(&fd, len)?;
        Ok((region, fd))
    }

    /// Maps a region the peer created, after checking that it is sealed against shrinking and
    /// holds `len` bytes (so no access within `len` can fault).
    pub(crate) fn map(fd: &OwnedFd, len: usize) -> std::io::Result<Region> {
        let seals = rustix::fs::fcntl_get_seals(fd)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(std::io::Error::other(
                "the shared region is not sealed against shrinking",
            ));
        }
        let size = rustix::fs::fstat(fd)?.st_size;
        if size < 0 || (size as u64) < len as u64 {
            return Err(std::io::Error::other(format!(
                "the shared region has {size} bytes, expected {len}"
            )));
        }
        Region::map_fd(fd, len)
    }

    fn map_fd(fd: &OwnedFd, len: usize) -> std::io::Result<Region> {
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least that long; nothing
        // else refers to the address range it returns.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd.as_fd(),
                0,
            )?
        };
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Region { ptr, len })
    }

    /// The start of the mapping.
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the range is the one `mmap` returned, and every `Ring` into it holds an
        // `Arc<Region>`, so nothing refers into it any more.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            log::warn!("creditflow: unmapping a shared region failed: {e}");
        }
    }
}
