//! The spill directory's life cycle: its own lock, the clean-up of dead processes' files,
//! the disk budget; and the spill file's bytes.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use super::dir::SpillDir;
use super::file::SpillFile;
use crate::base::error::Error;

/// A directory as a process that was killed leaves it: files, and a lock file nobody holds.
fn dead_owner(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("p-0.spill"), vec![7u8; 4096]).unwrap();
    std::fs::write(root.join(format!("{name}.lock")), b"").unwrap();
    dir
}

#[test]
fn a_new_directory_removes_dead_owners_files_and_keeps_live_ones() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path();
    let dead = dead_owner(root, "4242-00000000000000aa");
    // Killed between creating its directory and... nothing: no lock file at all.
    let orphan = root.join("4243-00000000000000bb");
    std::fs::create_dir(&orphan).unwrap();
    // Alive: another handle in this process holds its lock (a file lock held by any open
    // file description, as another process's would be).
    let live = dead_owner(root, "4244-00000000000000cc");
    let held = OpenOptions::new()
        .write(true)
        .open(root.join("4244-00000000000000cc.lock"))
        .unwrap();
    held.try_lock().unwrap();
    // Not ours: never touched.
    let foreign = root.join("data");
    std::fs::create_dir(&foreign).unwrap();

    let dir = SpillDir::open(Some(root), None).unwrap();
    assert_eq!(dir.swept(), 2);
    assert!(!dead.exists() && !root.join("4242-00000000000000aa.lock").exists());
    assert!(!orphan.exists());
    assert!(live.join("p-0.spill").exists(), "a live owner's files stay");
    assert!(foreign.exists());
    assert!(dir.path().starts_with(root));

    // A second directory in the same process does not take the first one for dead.
    let second = SpillDir::open(Some(root), None).unwrap();
    assert!(dir.path().exists() && second.path().exists());
    let first = dir.path().to_path_buf();
    drop(dir);
    assert!(!first.exists(), "dropping the directory removes it");
    drop(held);
    drop(second);
    let third = SpillDir::open(Some(root), None).unwrap();
    assert_eq!(third.swept(), 1, "the released lock now reads as dead");
    assert!(!live.exists());
}

#[test]
fn files_take_from_the_budget_and_give_back_when_removed() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path();
    let dir = SpillDir::open(Some(root), Some(10_000)).unwrap();
    let file = SpillFile::create(&dir, "p/1 weird:id").unwrap();
    assert!(file
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("p_1_weird_id"));
    let a = file.append(&[1u8; 6000]).unwrap();
    let b = file.append(&[2u8; 3000]).unwrap();
    assert_eq!((a.offset, b.offset), (0, 6000));
    assert_eq!(dir.used(), 9000);
    let err = file.append(&[3u8; 2000]).unwrap_err();
    assert!(
        matches!(&err, Error::Spill(m) if m.contains("max_spill") && m.contains("2000")),
        "{err}"
    );
    assert_eq!(file.len(), 9000, "a refused append writes nothing");
    let mut buf = Vec::new();
    file.read(b, &mut buf).unwrap();
    assert_eq!(buf, vec![2u8; 3000]);
    let path = file.path().to_path_buf();
    drop(file);
    assert!(!path.exists());
    assert_eq!(dir.used(), 0);
    assert_eq!(dir.bytes_written(), 9000);
}

#[test]
fn a_spill_directory_that_cannot_be_created_is_a_clear_error() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path();
    let blocker = root.join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let err = SpillDir::open(Some(&blocker.join("sub")), None).unwrap_err();
    assert!(
        matches!(&err, Error::Spill(m) if m.contains(blocker.to_str().unwrap())),
        "{err}"
    );
}
