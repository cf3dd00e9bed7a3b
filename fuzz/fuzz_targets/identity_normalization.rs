//! Fuzz target: see `checks::identity_normalization`.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)] // each target runs one of the checks
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::identity_normalization(data);
});
