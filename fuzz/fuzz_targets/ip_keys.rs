//! Fuzz target: see `platformkit_limit::internal::checks::ip_keys`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    platformkit_limit::internal::checks::ip_keys(data);
});
