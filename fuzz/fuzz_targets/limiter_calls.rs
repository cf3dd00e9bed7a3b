//! Fuzz target: see `platformkit_limit::internal::checks::limiter_calls`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    platformkit_limit::internal::checks::limiter_calls(data);
});
