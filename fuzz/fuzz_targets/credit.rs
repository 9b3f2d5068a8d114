//! cargo-fuzz target: see `creditflow_core::fuzz::credit` and `creditflow_core::fuzz::records` for the scenarios and its invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    creditflow_core::fuzz::credit::run(data);
    // The same bytes as a record-bytes scenario (protocol version 3).
    creditflow_core::fuzz::records::run(data);
});
