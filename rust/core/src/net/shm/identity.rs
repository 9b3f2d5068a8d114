//! What a side offering shared memory says about itself: the host's boot id (two processes
//! with the same boot id run on one kernel), its uid and its pid.

use crate::protocol::wire::ShmOffer;

/// The boot id of the running kernel as 16 bytes, if this system has one (Linux).
fn boot_id() -> Option<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        id[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(id)
}

/// This process's offer, with `key` naming its listener (0 for a client); `None` where
/// shared memory is not available (no boot id).
pub(crate) fn local_offer(key: u64) -> Option<ShmOffer> {
    Some(ShmOffer {
        boot_id: boot_id()?,
        uid: rustix::process::getuid().as_raw(),
        pid: rustix::process::getpid().as_raw_nonzero().get() as u32,
        key,
    })
}
