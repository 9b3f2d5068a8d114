//! cargo-fuzz target: see `creditflow_core::fuzz::credit` for the scenario and its invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| creditflow_core::fuzz::credit::run(data));
