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

/// The seeds built from the current wire format are in the committed corpus (a change of
/// the format without `make fuzz-seeds` leaves the fuzzer starting from stale inputs).
#[test]
fn frame_decoder_corpus_holds_the_current_seeds() {
    let have: std::collections::HashSet<Vec<u8>> = corpus("frame_decoder")
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let seeds = creditflow_core::fuzz::frames::seeds();
    let missing = seeds.iter().filter(|s| !have.contains(*s)).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} seeds missing from fuzz/corpus/frame_decoder: run `make fuzz-seeds`",
        seeds.len()
    );
    for seed in &seeds {
        creditflow_core::fuzz::frames::run(seed);
    }
}
