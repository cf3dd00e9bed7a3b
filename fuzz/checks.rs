//! The properties the fuzz targets and the property tests check, as plain
//! functions over bytes so that both can run them: `cargo fuzz` on nightly,
//! and `cargo test` on stable over the committed corpus and under proptest.
//!
//! Each function panics when a property does not hold. Test code, not the
//! library's: the fuzz targets and `tests/fuzz_corpus.rs` each include this
//! file as a module, over the public API and `platformkit_limit::internal`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, UNIX_EPOCH};

use platformkit_limit::internal::{decode, is_default_ignorable, normalize_identity};
use platformkit_limit::{Key, Limit, Limiter, ManualClock, Memory};

/// Splits fuzz input into key parts: parts are separated by the byte `0xFF`
/// (which never occurs in UTF-8) and read as UTF-8, invalid sequences
/// replaced.
pub fn parts_from_bytes(data: &[u8]) -> Vec<String> {
    data.split(|&b| b == 0xFF)
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect()
}

/// The key encoding: accepted by PostgreSQL (no NUL, no control character,
/// bounded), reversible when not digested, and injective.
pub fn key_encoding(data: &[u8]) {
    let parts = parts_from_bytes(data);
    let key = Key::new(&parts).expect("at least one part");
    assert_safe(&key);
    if key.is_digested() {
        let (_, digest) = key
            .as_str()
            .rsplit_once('~')
            .expect("a digested key has '~'");
        assert_eq!(digest.len(), 64);
        assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()));
    } else {
        assert_eq!(
            decode(key.as_str()),
            Some(parts.clone()),
            "decode inverts the encoding"
        );
    }
    // Injectivity over a second part list made from the same bytes: moving
    // the split points must change the key unless it leaves the list equal.
    if let Some(mid) = data.len().checked_div(2).filter(|&m| m > 0) {
        let mut other = parts_from_bytes(&data[..mid]);
        other.extend(parts_from_bytes(&data[mid..]));
        let other_key = Key::new(&other).expect("at least one part");
        assert_safe(&other_key);
        assert_eq!(
            other == parts,
            other_key == key,
            "distinct part lists, distinct keys"
        );
    }
}

fn assert_safe(key: &Key) {
    let s = key.as_str();
    assert!(
        s.len() <= Key::MAX_BYTES,
        "key longer than {} bytes",
        Key::MAX_BYTES
    );
    assert!(!s.contains('\0'), "key with NUL");
    assert!(
        !s.chars().any(char::is_control),
        "key with a control character"
    );
}

/// Email and username normalization: a fixed point (idempotent) with no
/// default-ignorable code point in it, the same without the input's
/// default-ignorable code points, and ASCII case variants agree.
pub fn identity_normalization(data: &[u8]) {
    let input = String::from_utf8_lossy(data);
    let once = normalize_identity(&input);
    assert_eq!(
        normalize_identity(&once),
        once,
        "normalization is idempotent"
    );
    assert!(
        !once.chars().any(is_default_ignorable),
        "normalization leaves no default-ignorable code point"
    );
    let visible: String = input
        .chars()
        .filter(|&c| !is_default_ignorable(c))
        .collect();
    assert_eq!(
        normalize_identity(&visible),
        once,
        "default-ignorable code points change nothing"
    );
    // Past the bound a key is of the first characters it read, so the key of
    // the normalized form is the input's only while neither is cut.
    if input.trim().chars().count() <= Key::MAX_INPUT_CHARS
        && once.chars().count() <= Key::MAX_INPUT_CHARS
    {
        assert_eq!(Key::email(&input), Key::email(&once));
        assert_eq!(Key::username(&input), Key::username(&once));
    }
    let flipped: String = input
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect();
    assert_eq!(
        normalize_identity(&flipped),
        once,
        "ASCII case variants are one key"
    );
    assert_safe(&Key::email(&input));
}

/// IP keys: every address in one prefix is one key; an IPv4-mapped IPv6
/// address is its IPv4 address; different prefixes are different keys.
pub fn ip_keys(data: &[u8]) {
    let mut bytes = [0_u8; 34];
    for (slot, b) in bytes.iter_mut().zip(data) {
        *slot = *b;
    }
    let prefix = bytes[0] % 128 + 1;
    let a = u128::from_be_bytes(bytes[1..17].try_into().expect("16 bytes"));
    let noise = u128::from_be_bytes(bytes[17..33].try_into().expect("16 bytes"));
    let host_bits = if prefix == 128 {
        0
    } else {
        u128::MAX >> prefix
    };
    let b = (a & !host_bits) | (noise & host_bits);
    let (ka, kb) = (
        Key::ip_grouped(IpAddr::V6(Ipv6Addr::from(a)), prefix).expect("valid prefix"),
        Key::ip_grouped(IpAddr::V6(Ipv6Addr::from(b)), prefix).expect("valid prefix"),
    );
    let mapped = |x: u128| Ipv6Addr::from(x).to_ipv4_mapped().is_some();
    if !mapped(a) && !mapped(b) {
        assert_eq!(ka, kb, "addresses in one /{prefix} are one key");
        let outside = a ^ (1_u128 << (128 - u32::from(prefix)));
        if !mapped(outside) {
            let ko =
                Key::ip_grouped(IpAddr::V6(Ipv6Addr::from(outside)), prefix).expect("valid prefix");
            assert_ne!(ka, ko, "a different /{prefix} is a different key");
        }
    }
    let v4 = Ipv4Addr::from(u32::from_be_bytes(bytes[1..5].try_into().expect("4 bytes")));
    assert_eq!(
        Key::ip(IpAddr::V4(v4)),
        Key::ip(IpAddr::V6(v4.to_ipv6_mapped())),
        "IPv4-mapped IPv6 is the IPv4 address"
    );
    assert_safe(&ka);
}

/// Runs `failed` and `check` with a fuzzed key through `Memory`: never a
/// panic, never an error, and the count goes up by one per failure.
pub fn limiter_calls(data: &[u8]) {
    let parts = parts_from_bytes(data);
    let key = Key::new(&parts).expect("at least one part");
    let limit = Limit::new("fuzz", 3, std::time::Duration::from_secs(60)).expect("a valid limit");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    // A pinned clock: on the wall clock, a window edge falling between the
    // calls would reset the count, and the check would fail for no fault of
    // the key handling (the fuzzer found exactly that).
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    runtime.block_on(async {
        let limiter = Limiter::new(Memory::new().with_clock(clock));
        let first = limiter
            .failed(&limit, &key)
            .await
            .expect("memory never errs");
        let second = limiter
            .failed(&limit, &key)
            .await
            .expect("memory never errs");
        assert_eq!(first.count().map(|c| c + 1), second.count());
        let check = limiter
            .check(&limit, &key)
            .await
            .expect("memory never errs");
        assert_eq!(check.count(), second.count());
    });
}
