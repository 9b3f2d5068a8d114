//! cargo-fuzz target: see `creditflow_core::fuzz::ready_queue` for the scenario and its invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| creditflow_core::fuzz::ready_queue::run(data));
