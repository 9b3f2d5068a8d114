//! Writes the frame decoder's seed inputs (`creditflow_core::fuzz::frames::seeds`) into
//! `fuzz/corpus/frame_decoder/`, one file each, named after a hash of its bytes. Run after a
//! change of the wire format (`make fuzz-seeds`); the corpus replay test checks that every
//! seed is there.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/frame_decoder");
    std::fs::create_dir_all(&dir)?;
    let mut written = 0;
    for seed in creditflow_core::fuzz::frames::seeds() {
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
