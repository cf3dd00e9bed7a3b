//! Fuzz target: see `checks::key_encoding`.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)] // each target runs one of the checks
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::key_encoding(data);
});
