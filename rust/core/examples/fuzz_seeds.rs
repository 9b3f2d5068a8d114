//! Writes the seed inputs built from the current formats into the fuzz corpus, one file each,
//! named after a hash of its bytes: the frame decoder's (`creditflow_core::fuzz::frames::seeds`)
//! into `fuzz/corpus/frame_decoder/`, the attach protocol's (`creditflow_core::fuzz::attach::seeds`)
//! into `fuzz/corpus/attach_codec/`. Run after a change of either format (`make fuzz-seeds`);
//! the corpus replay test checks that every seed is there.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

fn write(target: &str, seeds: Vec<Vec<u8>>) -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    std::fs::create_dir_all(&dir)?;
    let mut written = 0;
    for seed in seeds {
        let mut h = DefaultHasher::new();
        seed.hash(&mut h);
        let path = dir.join(format!("seed-{:016x}", h.finish()));
        if !path.exists() {
            std::fs::write(&path, &seed)?;
            written += 1;
        }
    }
    println!("{written} new seed(s) in {}", dir.display());
    Ok(())
}

fn main() -> std::io::Result<()> {
    write("frame_decoder", creditflow_core::fuzz::frames::seeds())?;
    write("attach_codec", creditflow_core::fuzz::attach::seeds())
}
