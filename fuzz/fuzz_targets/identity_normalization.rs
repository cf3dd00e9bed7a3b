//! Fuzz target: see `platformkit_limit::internal::checks::identity_normalization`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    platformkit_limit::internal::checks::identity_normalization(data);
});
