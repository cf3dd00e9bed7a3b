//! Fuzz target: see `checks::ip_keys`.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)] // each target runs one of the checks
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::ip_keys(data);
});
