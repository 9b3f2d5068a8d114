//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same harnesses
//! the cargo-fuzz targets run (`creditflow_core::fuzz`), so every interesting input found
//! by fuzzing stays a regression test in the normal `cargo test`; and the inputs that once
//! broke a target (`fuzz/regressions/<target>/`, kept out of the corpus so that minimizing it
//! cannot drop them).

use std::path::{Path, PathBuf};

/// The files of `fuzz/<kind>/<target>/`, sorted; none if the folder does not exist.
fn files(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(kind)
        .join(target);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    files.sort();
    files
}

fn corpus(target: &str) -> Vec<PathBuf> {
    let files = files("corpus", target);
    assert!(!files.is_empty(), "fuzz/corpus/{target} is missing or empty");
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    for path in corpus(target).into_iter().chain(files("regressions", target)) {
        let data = std::fs::read(&path).unwrap();
        let result = std::panic::catch_unwind(|| run(&data));
        assert!(result.is_ok(), "{} fails", path.display());
    }
}

#[test]
fn frame_decoder_corpus() {
    replay("frame_decoder", creditflow_core::fuzz::frames::run);
    assert!(
        !files("regressions", "frame_decoder").is_empty(),
        "the frame decoder's regressions are gone"
    );
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

#[test]
fn attach_codec_corpus() {
    replay("attach_codec", creditflow_core::fuzz::attach::run);
}

/// Every one of `seeds` is a file of `fuzz/corpus/<target>/` (a change of a format without
/// `make fuzz-seeds` leaves the fuzzer starting from stale inputs).
fn holds_the_current_seeds(target: &str, seeds: &[Vec<u8>]) {
    let have: std::collections::HashSet<Vec<u8>> =
        corpus(target).iter().map(|p| std::fs::read(p).unwrap()).collect();
    let missing = seeds.iter().filter(|s| !have.contains(*s)).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} seeds missing from fuzz/corpus/{target}: run `make fuzz-seeds`",
        seeds.len()
    );
}

/// The seeds built from the current wire format are in the committed corpus, and pass.
#[test]
fn frame_decoder_corpus_holds_the_current_seeds() {
    let seeds = creditflow_core::fuzz::frames::seeds();
    holds_the_current_seeds("frame_decoder", &seeds);
    for seed in &seeds {
        creditflow_core::fuzz::frames::run(seed);
    }
}

/// The attach protocol's seeds, one frame of each of its current messages, likewise.
#[test]
fn attach_codec_corpus_holds_the_current_seeds() {
    let seeds = creditflow_core::fuzz::attach::seeds();
    holds_the_current_seeds("attach_codec", &seeds);
    for seed in &seeds {
        creditflow_core::fuzz::attach::run(seed);
    }
}
