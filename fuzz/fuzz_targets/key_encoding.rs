//! Fuzz target: see `platformkit_limit::internal::checks::key_encoding`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    platformkit_limit::internal::checks::key_encoding(data);
});
