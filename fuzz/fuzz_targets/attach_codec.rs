//! cargo-fuzz target: see `creditflow_core::fuzz::attach` for the scenario and its invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| creditflow_core::fuzz::attach::run(data));
