//! Keys that would break a naive limiter, against real PostgreSQL.
//!
//! The limiter fails open: a key that made PostgreSQL raise an error would be
//! a way around every limit. And two spellings of one subject that land on
//! two rows multiply an attacker's attempts. So every hostile key here goes
//! through `failed` and `check` on a real server, and the test asserts that
//! no call errs or reports unreachable, that distinct subjects are counted
//! apart, and that equivalent spellings are counted together.

use std::net::IpAddr;
use std::time::Duration;

use platformkit_limit::{Key, Limit, Limiter, Postgres, SCHEMA};
use platformkit_limit_testdb::Server;

/// One subject and the spellings of it that must share one count.
struct Subject {
    what: String,
    spellings: Vec<Key>,
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

fn hostile_subjects() -> Vec<Subject> {
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
    let mut mebibyte_other = mebibyte.clone();
    mebibyte_other.replace_range(mebibyte.len() - 1.., "b");
    let long_multibyte = "é".repeat(150);
    subjects.extend([
        parts("1 MiB part", ["big", &mebibyte]),
        parts(
            "1 MiB part differing in its last byte, beyond the digest cut-off",
            ["big", &mebibyte_other],
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_never_break_the_statement() {
    let db = Server::shared().database(SCHEMA).await;
    // Generous: this test is about errors, not speed, on a shared machine.
    let limiter = Limiter::builder(Postgres::new(db.config()))
        .budget(Duration::from_secs(30))
        .build()
        .expect("a valid budget");
    let limit = Limit::new("hostile", 1_000, Duration::from_secs(3600)).expect("a valid limit");
    let subjects = hostile_subjects();
    let keys: usize = subjects.iter().map(|s| s.spellings.len()).sum();
    assert!(keys >= 40, "at least 40 hostile keys, have {keys}");

    // Distinct subjects must be distinct keys before the database sees them.
    for (i, a) in subjects.iter().enumerate() {
        for b in &subjects[i + 1..] {
            assert_ne!(
                a.spellings[0], b.spellings[0],
                "{:?} and {:?} share a key",
                a.what, b.what
            );
        }
    }

    // Each spelling records one failure.
    for subject in &subjects {
        for key in &subject.spellings {
            let verdict = limiter
                .failed(&limit, key)
                .await
                .unwrap_or_else(|e| panic!("failed for {:?}: {e}", subject.what));
            assert!(
                !verdict.is_unreachable(),
                "failed for {:?} reported unreachable: {:?}",
                subject.what,
                verdict.unreachable()
            );
        }
    }

    // Each subject counts exactly its own spellings, from every spelling.
    for subject in &subjects {
        for key in &subject.spellings {
            let verdict = limiter
                .check(&limit, key)
                .await
                .unwrap_or_else(|e| panic!("check for {:?}: {e}", subject.what));
            assert!(!verdict.is_unreachable(), "check for {:?}", subject.what);
            assert_eq!(
                verdict.count(),
                Some(subject.spellings.len() as u64),
                "count for {:?}",
                subject.what
            );
        }
    }

    // And the table holds one row per subject, each key within bounds.
    let admin = db.connect_admin().await;
    let row = admin
        .query_one(
            "SELECT count(*), max(octet_length(key)) FROM platformkit.platformkit_limits",
            &[],
        )
        .await
        .expect("a system read");
    let rows: i64 = row.get(0);
    let longest: i32 = row.get(1);
    assert_eq!(rows as usize, subjects.len());
    assert!(longest as usize <= "hostile|".len() + platformkit_limit::Key::MAX_BYTES);
}
