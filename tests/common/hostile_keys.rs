//! The hostile keys, for `tests/hostile_keys.rs` (on tokio-postgres) and the
//! driver suite (on each driver): every ASCII control character, a mebibyte
//! (apart by a character a key reads, together past it), multibyte text
//! across the digest cut-off, look-alikes, SQL, and spellings
//! of one subject that must share a count.

use std::net::IpAddr;

use platformkit_limit::Key;

/// One subject and the spellings of it that must share one count.
pub struct Subject {
    pub what: String,
    pub spellings: Vec<Key>,
}

fn one(what: impl Into<String>, key: Key) -> Subject {
    Subject {
        what: what.into(),
        spellings: vec![key],
    }
}

fn parts<const N: usize>(what: &str, parts: [&str; N]) -> Subject {
    one(what, Key::new(parts).expect("parts"))
}

fn ip(text: &str) -> Key {
    Key::ip(text.parse::<IpAddr>().expect("an address"))
}

/// The hostile keys, grouped by subject.
pub fn hostile_subjects() -> Vec<Subject> {
    let mut subjects = Vec::new();
    // Every ASCII control character, NUL first, inside a part.
    for c in (0_u8..0x20).chain([0x7F]) {
        let part = format!("a{}b", char::from(c));
        subjects.push(one(
            format!("ASCII control {c:#04x}"),
            Key::new(["ctl", &part]).expect("parts"),
        ));
    }
    let mebibyte = "a".repeat(1 << 20);
    // `big|` and the part: the last character a key reads is the part's
    // character `Key::MAX_INPUT_CHARS - 5`.
    let last_read = Key::MAX_INPUT_CHARS - 5;
    let mut differs_within = mebibyte.clone();
    differs_within.replace_range(last_read..=last_read, "b");
    let mut differs_past = mebibyte.clone();
    differs_past.replace_range(mebibyte.len() - 1.., "b");
    let long_multibyte = "é".repeat(150);
    subjects.push(Subject {
        what: "1 MiB part, and one differing only past the characters a key reads".into(),
        spellings: vec![
            Key::new(["big", &mebibyte]).expect("parts"),
            Key::new(["big", &differs_past]).expect("parts"),
        ],
    });
    subjects.extend([
        parts(
            "1 MiB part differing in the last character a key reads, beyond the digest cut-off",
            ["big", &differs_within],
        ),
        parts(
            "multibyte characters across the cut-off",
            ["big", &long_multibyte],
        ),
        parts("a lone combining mark", ["x", "\u{0301}"]),
        parts("a right-to-left override", ["x", "\u{202E}txt.exe"]),
        parts("a byte order mark", ["x", "\u{FEFF}"]),
        parts("a noncharacter", ["x", "\u{FFFF}"]),
        parts("a C1 control", ["x", "\u{0085}"]),
        parts("a line separator", ["x", "\u{2028}"]),
        parts("an emoji sequence", ["x", "👩\u{200D}👩\u{200D}👧"]),
        parts("the separator inside a part", ["a|b"]),
        parts("the same text as two parts", ["a", "b"]),
        parts("the escape character inside a part", ["a\\"]),
        parts("two escape characters", ["a\\\\"]),
        parts("an escaped-looking separator", ["a\\|b"]),
        parts("the digest marker inside a part", ["a~b"]),
        parts("one empty part", [""]),
        parts("two empty parts", ["", ""]),
        parts("a trailing empty part", ["x", ""]),
        parts(
            "a quote and SQL",
            ["x", "'); DROP TABLE platformkit.platformkit_limits; --"],
        ),
        parts("a percent and underscore", ["x", "%_"]),
        parts("escape-looking text", ["x", "\\x00"]),
        one(
            "a Cyrillic homoglyph of alice",
            Key::email("\u{0430}lice@example.com"),
        ),
        Subject {
            what: "alice's address, spelled four ways".into(),
            spellings: vec![
                Key::email("alice@example.com"),
                Key::email("Alice@Example.COM"),
                Key::email("  alice@example.com\t"),
                Key::email("ＡＬＩＣＥ@example.com"),
            ],
        },
        Subject {
            what: "a username with a sharp s".into(),
            spellings: vec![Key::username("Straße"), Key::username("STRASSE")],
        },
        Subject {
            what: "an IPv4 address and its IPv4-mapped IPv6 form".into(),
            spellings: vec![ip("192.0.2.7"), ip("::ffff:192.0.2.7")],
        },
        Subject {
            what: "two addresses of one IPv6 /64".into(),
            spellings: vec![
                ip("2001:db8:1:2::1"),
                ip("2001:db8:1:2:ffff:ffff:ffff:ffff"),
            ],
        },
        one("the next /64", ip("2001:db8:1:3::1")),
    ]);
    subjects
}
