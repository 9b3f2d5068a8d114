//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same harnesses
//! the cargo-fuzz targets run (`creditflow_core::fuzz`), so every interesting input found
//! by fuzzing stays a regression test in the normal `cargo test`.

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    for path in corpus(target) {
        let data = std::fs::read(&path).unwrap();
        let result = std::panic::catch_unwind(|| run(&data));
        assert!(result.is_ok(), "{} fails", path.display());
    }
}

#[test]
fn frame_decoder_corpus() {
    replay("frame_decoder", creditflow_core::fuzz::frames::run);
}

#[test]
fn credit_corpus() {
    replay("credit", |data| {
        creditflow_core::fuzz::credit::run(data);
        creditflow_core::fuzz::records::run(data);
    });
}

#[test]
fn ready_queue_corpus() {
    replay("ready_queue", creditflow_core::fuzz::ready_queue::run);
}
