//! Keys: the key encoding (golden vectors and properties), the bound on the
//! work a key does, and the spellings of one address or name that are one
//! key (against a real server: what its case-insensitive collation
//! equates). What `Limit::new` and the builders refuse is in
//! `tests/configuration.rs`.

use std::net::IpAddr;
use std::sync::OnceLock;

use platformkit_limit::internal::{decode, is_default_ignorable};
use platformkit_limit::{ErrorKind, Key};
use proptest::prelude::*;

/// Length of a digest suffix: `~` and 64 hex digits.
const DIGEST_SUFFIX_BYTES: usize = 65;

/// The longest readable prefix in front of a digest.
const PREFIX_BYTES: usize = Key::MAX_BYTES - DIGEST_SUFFIX_BYTES;

fn ip(text: &str) -> IpAddr {
    text.parse().expect("a valid IP address")
}

fn key(parts: &[&str]) -> Key {
    Key::new(parts).expect("a key with at least one part")
}

fn repeat(c: char, n: usize) -> String {
    std::iter::repeat_n(c, n).collect()
}

/// The encoding as the module docs define it, before any digest: each part
/// escaped, the parts joined with `|`. Used to predict when a key is digested.
fn reference_encoding(parts: &[String]) -> String {
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        for c in part.chars() {
            match c {
                '\\' => out.push_str(r"\\"),
                '|' => out.push_str(r"\|"),
                '~' => out.push_str(r"\~"),
                c if ('\u{0}'..='\u{1f}').contains(&c) || ('\u{7f}'..='\u{9f}').contains(&c) => {
                    out.push_str(&format!(r"\x{:02x}", u32::from(c)));
                }
                c => out.push(c),
            }
        }
    }
    out
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `c` is a `Default_Ignorable_Code_Point` as `regex-syntax`'s
/// Unicode tables say: the reference for the crate's own table.
fn unicode_default_ignorable(c: char) -> bool {
    static RANGES: OnceLock<Vec<(char, char)>> = OnceLock::new();
    let ranges = RANGES.get_or_init(|| {
        let hir = regex_syntax::parse(r"\p{Default_Ignorable_Code_Point}")
            .expect("a Unicode property regex");
        match hir.kind() {
            regex_syntax::hir::HirKind::Class(regex_syntax::hir::Class::Unicode(class)) => class
                .ranges()
                .iter()
                .map(|r| (r.start(), r.end()))
                .collect(),
            other => panic!("not a class of characters: {other:?}"),
        }
    });
    ranges
        .iter()
        .any(|&(first, last)| (first..=last).contains(&c))
}

// ---------------------------------------------------------------------------
// Golden vectors
// ---------------------------------------------------------------------------

// THE KEY ENCODING IS STORED DATA. Every row of `platformkit.platformkit_limits` holds an
// encoded key; if a vector below has to change, every key already stored no
// longer matches what the new code computes, and every counter in every
// deployment silently starts again from zero on deploy (a lockout forgotten,
// a brute-force window reopened). Do not update these vectors to make a
// change pass: a change of encoding is a breaking change that needs a
// migration of the stored rows and a major version.
//
// The digests were computed independently of the crate (with `sha256sum` over
// the full encoding shown in each comment).

/// (what was encoded, the key it must give).
fn golden_vectors() -> Vec<(&'static str, Key, String)> {
    vec![
        // Plain parts are joined with '|'.
        (
            r#"["account", "42"]"#,
            key(&["account", "42"]),
            "account|42".to_owned(),
        ),
        // The separator inside a part is escaped: it cannot fake a second part.
        (r#"["a|b"]"#, key(&["a|b"]), r"a\|b".to_owned()),
        (
            r#"["a", "|", "b"]"#,
            key(&["a", "|", "b"]),
            r"a|\||b".to_owned(),
        ),
        // The escape character escapes itself, so "\|" in a part stays apart
        // from an escaped separator.
        (r#"["a\\b"]"#, key(&["a\\b"]), r"a\\b".to_owned()),
        (r#"["\\|"]"#, key(&["\\|"]), r"\\\|".to_owned()),
        // The digest marker is escaped.
        (r#"["~"]"#, key(&["~"]), r"\~".to_owned()),
        // Empty parts are parts.
        (r#"[""]"#, key(&[""]), String::new()),
        (r#"["", ""]"#, key(&["", ""]), "|".to_owned()),
        // Control characters (C0, DEL, C1) become \xHH in lowercase hex.
        (
            r#"["a\0b\x1fc\x7fd\u{85}e\u{9f}"]"#,
            key(&["a\0b\x1fc\x7fd\u{85}e\u{9f}"]),
            r"a\x00b\x1fc\x7fd\x85e\x9f".to_owned(),
        ),
        // Everything else is itself: non-ASCII letters, emoji, non-breaking
        // and line-separator spaces (not control characters).
        (
            r#"["😀", "é", "\u{a0}\u{2028}"]"#,
            key(&["😀", "é", "\u{a0}\u{2028}"]),
            "😀|é|\u{a0}\u{2028}".to_owned(),
        ),
        // Opaque identifiers: used exactly as given.
        (
            r#"opaque("Order-7")"#,
            Key::opaque("Order-7"),
            "id|Order-7".to_owned(),
        ),
        (
            r#"opaque(" a|B ")"#,
            Key::opaque(" a|B "),
            r"id| a\|B ".to_owned(),
        ),
        // Addresses.
        (
            r#"ip(192.0.2.7)"#,
            Key::ip(ip("192.0.2.7")),
            "ip|192.0.2.7".to_owned(),
        ),
        (
            r#"ip(::ffff:192.0.2.7)"#,
            Key::ip(ip("::ffff:192.0.2.7")),
            "ip|192.0.2.7".to_owned(),
        ),
        (
            r#"ip(2001:db8:1:2:aaaa::1)"#,
            Key::ip(ip("2001:db8:1:2:aaaa::1")),
            "ip|2001:db8:1:2::/64".to_owned(),
        ),
        (
            r#"ip_grouped(2001:db8:1:2:aaaa::1, 48)"#,
            Key::ip_grouped(ip("2001:db8:1:2:aaaa::1"), 48).unwrap(),
            "ip|2001:db8:1::/48".to_owned(),
        ),
        (
            r#"ip_grouped(2001:db8:1:2:aaaa::1, 128)"#,
            Key::ip_grouped(ip("2001:db8:1:2:aaaa::1"), 128).unwrap(),
            "ip|2001:db8:1:2:aaaa::1/128".to_owned(),
        ),
        (
            r#"ip_grouped(::ffff:192.0.2.7, 48)"#,
            Key::ip_grouped(ip("::ffff:192.0.2.7"), 48).unwrap(),
            "ip|192.0.2.7".to_owned(),
        ),
        // A 1 MiB part, past `Key::MAX_INPUT_CHARS`: cut. The first 135
        // bytes, '~', and the SHA-256 of the encoding of what was read ("a" x
        // 1600) followed by a NUL byte. (Without the bound, the digest would
        // be of the whole 1 MiB: 9bc1b2a2….)
        (
            r#"["a" x 1 MiB]"#,
            key(&[&repeat('a', 1 << 20)]),
            repeat('a', 135) + "~80ed9f7177bc557d1e21f35377ed09fe3ef02c168460cc96bc7978edc63e6f4f",
        ),
        // A 1 MiB address of U+FDFA, each one 18 characters in NFKC: the
        // first 1600 normalized (with Python's `unicodedata` NFKC and
        // `casefold`), the first 134 bytes of `email|…`, '~', and the SHA-256
        // of the encoding followed by a NUL byte.
        (
            r#"email("\u{fdfa}" x 1 MiB)"#,
            Key::email(&repeat('\u{fdfa}', (1 << 20) / 3)),
            format!(
                "email|{}صلى الله عليه وس~01b89153fa6beeb0aca1c1c90a257893623907c4d2a3af0d137e01f5e543e501",
                "صلى الله عليه وسلم".repeat(3)
            ),
        ),
        // The cut never splits an escape: "\|" would straddle byte 135, so the
        // prefix stops at 134. Full encoding: "a" x 134, "\|", "b" x 200.
        (
            r#"["a" x 134 + "|" + "b" x 200]"#,
            key(&[&(repeat('a', 134) + "|" + &repeat('b', 200))]),
            repeat('a', 134) + "~130f88488e29a0af3ed0a3fbcd501cbca42984b981c25b620d90dc69e150e662",
        ),
        // Nor a \xHH escape. Full encoding: "a" x 133, "\x00", "b" x 200.
        (
            r#"["a" x 133 + "\0" + "b" x 200]"#,
            key(&[&(repeat('a', 133) + "\0" + &repeat('b', 200))]),
            repeat('a', 133) + "~0c4923db02b5c829778d9a3cad61051781e827b4f027b8330bb06c3073c11c75",
        ),
        // Nor a multi-byte character. Full encoding: "a" x 134, "é", "b" x 200.
        (
            r#"["a" x 134 + "é" + "b" x 200]"#,
            key(&[&(repeat('a', 134) + "é" + &repeat('b', 200))]),
            repeat('a', 134) + "~3588654d035a46ff6977b5d20fcc6033cd49a66a63d06ad0b451d9b0deae8690",
        ),
        // Email and username normalization is part of the stored key too.
        (
            r#"email " Alice@Example.COM ""#,
            Key::email(" Alice@Example.COM "),
            "email|alice@example.com".to_owned(),
        ),
        (
            r#"email full-width "ＡＬＩＣＥ@example.com""#,
            Key::email("ＡＬＩＣＥ@example.com"),
            "email|alice@example.com".to_owned(),
        ),
        (
            r#"email "a.lice+tag@example.com""#,
            Key::email("a.lice+tag@example.com"),
            "email|a.lice+tag@example.com".to_owned(),
        ),
        (
            r#"username "Straße""#,
            Key::username("Straße"),
            "user|strasse".to_owned(),
        ),
        (
            r#"username "ΣΊΣΥΦΟΣ""#,
            Key::username("ΣΊΣΥΦΟΣ"),
            "user|σίσυφοσ".to_owned(),
        ),
        (
            r#"username "ﬁona|x""#,
            Key::username("ﬁona|x"),
            r"user|fiona\|x".to_owned(),
        ),
    ]
}

#[test]
fn golden_vectors_pin_the_encoding() {
    let vectors = golden_vectors();
    assert!(vectors.len() >= 12);
    for (input, key, expected) in vectors {
        assert_eq!(
            key.as_str(),
            expected,
            "the key encoding changed: this is a breaking change (every stored counter \
             would silently reset on deploy); input {input}"
        );
        // Only a digested key has an unescaped '~', which decoding refuses.
        assert_eq!(
            key.is_digested(),
            decode(&expected).is_none(),
            "is_digested for {input}"
        );
    }
}

#[test]
fn a_key_exactly_at_the_limit_is_not_digested() {
    let at_limit = key(&[&repeat('a', Key::MAX_BYTES)]);
    assert_eq!(at_limit.as_str(), repeat('a', Key::MAX_BYTES));
    assert!(!at_limit.is_digested());

    let one_over = key(&[&repeat('a', Key::MAX_BYTES + 1)]);
    assert!(one_over.is_digested());
    assert_eq!(one_over.as_str().len(), Key::MAX_BYTES);
    assert!(one_over.as_str().starts_with(&repeat('a', PREFIX_BYTES)));

    // Escapes count with their escaped length: 100 '|' are 200 bytes.
    let escaped_at_limit = key(&[&repeat('|', Key::MAX_BYTES / 2)]);
    assert!(!escaped_at_limit.is_digested());
    assert!(key(&[&repeat('|', Key::MAX_BYTES / 2 + 1)]).is_digested());
}

#[test]
fn addresses_group_the_way_one_holder_does() {
    assert_eq!(Key::ip(ip("192.0.2.7")), Key::ip(ip("::ffff:192.0.2.7")));
    assert_eq!(
        Key::ip(ip("2001:db8:1:2:aaaa::1")),
        Key::ip(ip("2001:db8:1:2:ffff::9"))
    );
    assert_ne!(
        Key::ip(ip("2001:db8:1:2::1")),
        Key::ip(ip("2001:db8:1:3::1"))
    );
    assert_ne!(Key::ip(ip("192.0.2.7")), Key::ip(ip("192.0.2.8")));
    // An address is not the same key as the same text given as an opaque id.
    assert_ne!(Key::ip(ip("192.0.2.7")), Key::opaque("192.0.2.7"));
    for bad in [0, 129, 255] {
        let err = Key::ip_grouped(ip("2001:db8::1"), bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "prefix {bad}");
    }
}

#[test]
fn a_key_needs_a_part() {
    let err = Key::new(Vec::<String>::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey);
    assert!(!err.is_unreachable());
    assert!(err.to_string().contains("at least one part"), "{err}");
}

#[test]
fn key_debug_does_not_show_the_key() {
    for key in [
        key(&["email", "alice@example.com"]),
        Key::opaque("alice@example.com"),
        key(&[&("alice@example.com".repeat(30))]),
    ] {
        let shown = format!("{key:?} {key:#?}");
        assert!(!shown.contains("alice"), "{shown}");
        assert!(!shown.contains(key.as_str()), "{shown}");
    }
    let ip_key = Key::ip(ip("192.0.2.7"));
    let shown = format!("{ip_key:?}");
    assert!(!shown.contains("192.0.2"), "{shown}");
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

/// One character of a part: mostly the troublesome ones.
fn part_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => any::<char>(),
        3 => prop::sample::select(vec![
            '|', '\\', '~', 'x', '0', 'a', '\0', '\x1f', '\x7f', '\u{85}', '\u{9f}', '\u{a0}',
            'é', '😀',
        ]),
        2 => prop::char::range('\0', '\u{a0}'),
    ]
}

fn part(max_chars: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(part_char(), 0..=max_chars).prop_map(|cs| cs.into_iter().collect())
}

/// Part lists of every size, some long enough to be digested.
fn parts() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        3 => prop::collection::vec(part(12), 1..6),
        1 => prop::collection::vec(part(80), 1..6),
    ]
}

/// Part lists whose encoding is longer than a key may be, so digested: with
/// the cut anywhere, in a short part or a long one.
fn long_parts() -> impl Strategy<Value = Vec<String>> {
    let long_part =
        prop::collection::vec(part_char(), 201..260).prop_map(|cs| cs.into_iter().collect());
    prop_oneof![
        (
            prop::collection::vec(part(40), 0..5),
            long_part,
            any::<prop::sample::Index>()
        )
            .prop_map(|(mut parts, long, at)| {
                let at = at.index(parts.len() + 1);
                parts.insert(at, long);
                parts
            }),
        prop::collection::vec(part(80), 2..6)
            .prop_filter("digested", |p| reference_encoding(p).len() > Key::MAX_BYTES),
    ]
}

/// Part lists over a tiny alphabet, so that different lists often have the
/// same characters in a different arrangement.
fn small_parts() -> impl Strategy<Value = Vec<String>> {
    let c = prop::sample::select(vec!['a', '|', '\\', '~', 'x', '0', '\0']);
    let part = prop::collection::vec(c, 0..4).prop_map(|cs| cs.into_iter().collect::<String>());
    prop::collection::vec(part, 1..5)
}

/// Pairs of part lists, often near misses of one another: parts merged
/// around a '|', split, or one with an escape-like tail.
fn pairs() -> impl Strategy<Value = (Vec<String>, Vec<String>)> {
    prop_oneof![
        (small_parts(), small_parts()),
        small_parts().prop_map(|a| {
            // ["x", "y"] and ["x|y"].
            let b = vec![a.join("|")];
            (a, b)
        }),
        (
            small_parts(),
            prop::sample::select(vec!["\\", "|", "~", "\\x00", "\0", ""])
        )
            .prop_map(|(a, tail)| {
                let mut b = a.clone();
                b.last_mut().unwrap().push_str(tail);
                (a, b)
            }),
        (parts(), parts()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: crate::common::cases(256),
        // A failure prints its minimal input; nothing is written beside the
        // sources.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_encoding_is_bounded_and_plain(parts in parts()) {
        let key = Key::new(&parts).unwrap();
        let text = key.as_str();
        prop_assert!(text.len() <= Key::MAX_BYTES, "{} bytes", text.len());
        prop_assert!(!text.contains('\0'));
        prop_assert!(!text.chars().any(char::is_control), "{text:?}");

        let full = reference_encoding(&parts);
        prop_assert_eq!(key.is_digested(), full.len() > Key::MAX_BYTES);
        if key.is_digested() {
            prop_assert_eq!(text.len() - text.rfind('~').unwrap(), DIGEST_SUFFIX_BYTES);
        } else {
            prop_assert_eq!(text, full.as_str());
        }
    }

    #[test]
    fn an_undigested_key_decodes_to_its_parts(parts in parts()) {
        let key = Key::new(&parts).unwrap();
        if !key.is_digested() {
            prop_assert_eq!(decode(key.as_str()), Some(parts));
        } else {
            prop_assert_eq!(decode(key.as_str()), None);
        }
    }

    #[test]
    fn a_digested_key_is_a_readable_prefix_and_a_digest(parts in long_parts()) {
        let key = Key::new(&parts).unwrap();
        prop_assert!(key.is_digested());
        let text = key.as_str();
        let (prefix, digest) = text.split_at(text.len() - 64);
        let prefix = prefix.strip_suffix('~').expect("'~' before the digest");
        prop_assert!(is_lower_hex(digest), "{digest}");
        // The prefix is as long as whole units allow (a unit is at most 4
        // bytes: an \xHH escape or one UTF-8 character)...
        prop_assert!(prefix.len() <= PREFIX_BYTES);
        prop_assert!(prefix.len() > PREFIX_BYTES - 4, "{} bytes", prefix.len());
        // ...and ends between whole escapes: it decodes, to the leading
        // parts and the start of the next one.
        let decoded = decode(prefix).expect("the prefix ends between whole escapes");
        let (last, whole) = decoded.split_last().unwrap();
        prop_assert_eq!(whole, &parts[..whole.len()]);
        prop_assert!(parts[whole.len()].starts_with(last.as_str()));
        prop_assert!(reference_encoding(&parts).starts_with(prefix));
    }

    #[test]
    fn different_parts_give_different_keys((a, b) in pairs()) {
        let (ka, kb) = (Key::new(&a).unwrap(), Key::new(&b).unwrap());
        if a == b {
            prop_assert_eq!(ka, kb);
        } else {
            prop_assert_ne!(ka.as_str(), kb.as_str(), "{:?} and {:?}", a, b);
            prop_assert_ne!(ka, kb);
        }
    }

    #[test]
    fn long_keys_that_differ_past_the_cut_differ(
        // At least 201 characters: the encoding is digested and its readable
        // prefix lies wholly within the common head.
        head in prop::collection::vec(part_char(), 201..260)
            .prop_map(|cs| cs.into_iter().collect::<String>()),
        tails in (part(6), part(6)).prop_filter("different", |(x, y)| x != y),
        split in any::<bool>(),
    ) {
        let (x, y) = tails;
        let (a, b) = if split {
            (vec![head.clone(), x], vec![head, y])
        } else {
            (vec![head.clone() + &x], vec![head + &y])
        };
        let (ka, kb) = (Key::new(&a).unwrap(), Key::new(&b).unwrap());
        prop_assert!(ka.is_digested() && kb.is_digested());
        prop_assert_ne!(ka.as_str(), kb.as_str());
        let cut = |k: &Key| k.as_str().len() - DIGEST_SUFFIX_BYTES;
        prop_assert_eq!(&ka.as_str()[..cut(&ka)], &kb.as_str()[..cut(&kb)]);
    }
}

// ---------------------------------------------------------------------------
// Bounded work: a key reads at most `Key::MAX_INPUT_CHARS` of its input
// ---------------------------------------------------------------------------

/// The keys as they were before the bound, kept as the reference: the
/// encoding of every part whole, digested over all of it when too long, and
/// addresses and names normalized whole (with default-ignorable code points
/// dropped, as keys drop them since).
mod before_the_bound {
    use platformkit_limit::Key;
    use sha2::{Digest, Sha256};
    use unicode_normalization::UnicodeNormalization;

    /// Trims, drops default-ignorable code points, applies NFKC and full
    /// case folding, until nothing changes.
    pub fn normalize_identity(input: &str) -> String {
        let trimmed = input.trim();
        if trimmed.is_ascii() {
            return trimmed.to_ascii_lowercase();
        }
        let mut current = trimmed.to_owned();
        for _ in 0..8 {
            let kept: String = current
                .chars()
                .filter(|&c| !super::unicode_default_ignorable(c))
                .collect();
            let nfkc: String = kept.nfkc().collect();
            let folded = caseless::default_case_fold_str(&nfkc);
            let next: String = folded.nfkc().collect::<String>().trim().to_owned();
            if next == current {
                break;
            }
            current = next;
        }
        current
    }

    pub fn key(parts: &[String]) -> String {
        let encoded = super::reference_encoding(parts);
        if encoded.len() <= Key::MAX_BYTES {
            return encoded;
        }
        let digest = Sha256::digest(encoded.as_bytes());
        let cut = prefix_end(&encoded, Key::MAX_BYTES - super::DIGEST_SUFFIX_BYTES);
        let mut out = encoded[..cut].to_owned();
        out.push('~');
        for byte in digest {
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }

    pub fn email(address: &str) -> String {
        key(&["email".to_owned(), normalize_identity(address)])
    }

    pub fn username(name: &str) -> String {
        key(&["user".to_owned(), normalize_identity(name)])
    }

    fn prefix_end(encoded: &str, max: usize) -> usize {
        let mut end = 0;
        let mut chars = encoded.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            let unit_len = if c == '\\' {
                match chars.next() {
                    Some((_, 'x')) => {
                        chars.next();
                        chars.next();
                        4
                    }
                    Some(_) => 2,
                    None => 1,
                }
            } else {
                c.len_utf8()
            };
            if i + unit_len > max {
                break;
            }
            end = i + unit_len;
        }
        end
    }
}

/// Characters that normalization expands, shortens or folds, white space,
/// and the ones the encoding escapes.
fn identity_char() -> impl Strategy<Value = char> {
    prop_oneof![
        2 => any::<char>(),
        4 => prop::sample::select(vec![
            'a', 'Z', '@', '.', ' ', '\t', '\u{a0}', '\u{3000}', '|', '\\', '~', '\0', '\u{85}',
            '\u{fdfa}', '\u{fdfb}', '\u{3300}', '\u{fb03}', '\u{1e9e}', '\u{390}', '\u{130}',
            '\u{1f82}', '\u{a8}', '\u{308}', '\u{304}', '\u{301}', '\u{345}', '\u{1100}',
            '\u{1161}', '\u{11a8}', 'Ω', 'ß', 'İ', 'ﬁ', 'Ａ', '😀', '\u{ad}', '\u{200b}',
            '\u{2066}', '\u{feff}', '\u{e0041}',
        ]),
    ]
}

fn identity(chars: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
    prop::collection::vec(identity_char(), chars).prop_map(|cs| cs.into_iter().collect())
}

/// Inputs that are as short as they can be once encoded and normalized: one
/// byte a character, or sequences that compose into one character.
fn narrow_identity(chars: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
    let unit = prop::sample::select(vec![
        "a",
        "Z",
        ".",
        "@",
        " ",
        "U\u{308}\u{304}",
        "\u{1100}\u{1161}\u{11a8}",
        "\u{3b1}\u{313}\u{300}\u{345}",
        "e\u{301}",
    ]);
    let max = *chars.end();
    prop::collection::vec(unit, chars).prop_map(move |units| {
        let s: String = units.concat();
        first_chars(&s, max).to_owned()
    })
}

/// The first `n` characters of `s`.
fn first_chars(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(i, _)| &s[..i])
}

/// The parts' characters, each `|` between them counted as one.
fn input_chars(parts: &[String]) -> usize {
    parts.iter().map(|p| p.chars().count()).sum::<usize>() + parts.len().saturating_sub(1)
}

/// The characters of an address or a name that count toward the bound:
/// those between the white space and default-ignorable code points at
/// either end, the default-ignorable ones not counted.
fn identity_chars(input: &str) -> usize {
    let skipped = |c: char| c.is_whitespace() || unicode_default_ignorable(c);
    input
        .trim_matches(skipped)
        .chars()
        .filter(|&c| !unicode_default_ignorable(c))
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: crate::common::cases(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Within the bound, every key is the key it was before: addresses and
    /// names whatever they normalize to, parts whatever they escape to.
    #[test]
    fn within_the_bound_every_key_is_the_key_it_was_before(
        input in identity(0..=80),
        parts in prop::collection::vec(identity(0..=60), 1..5),
    ) {
        let (email, username) = (Key::email(&input), Key::username(&input));
        prop_assert_eq!(email.as_str(), before_the_bound::email(&input));
        prop_assert_eq!(username.as_str(), before_the_bound::username(&input));
        let opaque = Key::opaque(&input);
        prop_assert_eq!(
            opaque.as_str(),
            before_the_bound::key(&["id".to_owned(), input.clone()])
        );
        let new = Key::new(&parts).unwrap();
        prop_assert_eq!(new.as_str(), before_the_bound::key(&parts));
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Each case normalizes about 1600 characters twice.
        cases: crate::common::cases(24),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Around the bound: an input of at most `Key::MAX_INPUT_CHARS`
    /// characters is the key it was before; one past it, whose key was
    /// digested before too, is still digested.
    #[test]
    fn at_the_bound_a_key_is_the_key_it_was_before_or_was_digested_already(
        input in prop_oneof![
            identity(Key::MAX_INPUT_CHARS - 8..=Key::MAX_INPUT_CHARS + 8),
            narrow_identity(Key::MAX_INPUT_CHARS - 8..=Key::MAX_INPUT_CHARS + 8),
        ],
        pad in identity(0..=3),
    ) {
        let parts = vec![pad, input.clone()];
        let new = Key::new(&parts).unwrap();
        if input_chars(&parts) <= Key::MAX_INPUT_CHARS {
            prop_assert_eq!(new.as_str(), before_the_bound::key(&parts));
        } else {
            prop_assert!(new.is_digested());
            let before = before_the_bound::key(&parts);
            prop_assert!(decode(&before).is_none(), "parts past the bound had an undigested key");
        }
        let email = Key::email(&input);
        if identity_chars(&input) <= Key::MAX_INPUT_CHARS {
            prop_assert_eq!(email.as_str(), before_the_bound::email(&input));
        } else {
            prop_assert!(email.is_digested());
            let before = before_the_bound::email(&input);
            prop_assert!(decode(&before).is_none(), "an address past the bound had an undigested key");
        }
    }
}

/// The longest input of each of the characters that normalization expands
/// most (or the encoding escapes), 1 MiB of it: every constructor reads no
/// more than its first `Key::MAX_INPUT_CHARS` characters. Whatever follows
/// them gives the same key, so the work is that of the prefix however long
/// the input; and the key is digested, never the key of an input the bound
/// did not cut.
#[test]
fn no_constructor_reads_past_its_first_max_input_chars() {
    let n = Key::MAX_INPUT_CHARS;
    for c in [
        '\u{fdfa}', '\u{fdfb}', '\u{3300}', '\u{fb03}', '\u{1e9e}', '\u{390}', '\u{1f82}',
        '\u{a8}', 'A', '|', '~', '\0',
    ] {
        let long = repeat(c, (1 << 20) / c.len_utf8());
        let head = first_chars(&long, n);
        let other = format!("{head}, then something else@example.com");
        for (what, key, of_head) in [
            ("email", Key::email(&long), Key::email(&other)),
            ("username", Key::username(&long), Key::username(&other)),
            ("opaque", Key::opaque(&long), {
                // `id|` is three of the characters read.
                Key::opaque(&(first_chars(&long, n - 3).to_owned() + "x"))
            }),
            ("new", key(&[&long]), key(&[&other])),
            (
                "new, then a part never read",
                key(&[&long, "b"]),
                key(&[head, "c"]),
            ),
            (
                "new, after a part",
                key(&["k", &long]),
                key(&["k", &(first_chars(&long, n - 2).to_owned() + "x")]),
            ),
        ] {
            assert_eq!(
                key,
                of_head,
                "{what} of U+{:04X} read past its prefix",
                u32::from(c)
            );
            assert!(key.is_digested(), "{what} of U+{:04X}", u32::from(c));
        }
    }
    // Parts past the bound are not read either, however many.
    let many: Vec<String> = (0..1 << 16).map(|i| i.to_string()).collect();
    let mut others = many.clone();
    others[Key::MAX_INPUT_CHARS] = "other".to_owned();
    assert_eq!(Key::new(&many).unwrap(), Key::new(&others).unwrap());

    // White space around an address is trimmed, however much: no cut.
    let spaces = repeat(' ', 1 << 20);
    let alice = Key::email("alice@example.com");
    assert_eq!(Key::email(&format!("{spaces}Alice@Example.com")), alice);
    assert_eq!(Key::email(&format!("Alice@Example.com{spaces}")), alice);
    assert!(!alice.is_digested());
}

/// A cut input's key is never the key of an input that was not cut, even
/// when both read the same characters.
#[test]
fn a_cut_key_is_never_the_key_of_an_input_within_the_bound() {
    let n = Key::MAX_INPUT_CHARS;
    let within = repeat('a', n);
    let past = repeat('a', n + 1);
    assert_ne!(key(&[&within]), key(&[&past]));
    assert_ne!(Key::email(&within), Key::email(&past));
    assert_ne!(key(&[&within]), key(&[&within, ""]));
}

/// The factors the bound rests on (see `Key`'s "Bounded work"), over every
/// Unicode scalar value: a canonical decomposition has at most 4
/// characters, so composition puts at most 4 into one; case folding never
/// lowers the number of characters of the compatibility decomposition; no
/// character but white space decomposes to white space alone; no character
/// decomposes or folds into a default-ignorable code point unless it is
/// one (so the characters the bound counts are never dropped); NFKC
/// expands a character to at most 18, case folding to at most 3. And the
/// inputs that shorten most under normalization still do not fit once
/// past the bound.
#[test]
fn the_bound_rests_on_factors_that_hold_for_every_character() {
    use unicode_normalization::UnicodeNormalization;

    let (mut nfd, mut nfkc, mut fold) = (0, 0, 0);
    for c in (0..=0x10ffff).filter_map(char::from_u32) {
        let one = c.to_string();
        nfd = nfd.max(one.nfd().count());
        nfkc = nfkc.max(one.nfkc().count());
        let folded = caseless::default_case_fold_str(&one);
        fold = fold.max(folded.chars().count());
        let decomposed = one.nfkd().count();
        assert!(
            folded.nfkd().count() >= decomposed,
            "folding U+{:04X} lowers its decomposition",
            u32::from(c)
        );
        if !c.is_whitespace() {
            assert!(
                one.nfkd().any(|d| !d.is_whitespace()),
                "U+{:04X} decomposes to white space alone",
                u32::from(c)
            );
        }
        if !is_default_ignorable(c) {
            assert!(
                !one.nfkd()
                    .chain(one.nfkc())
                    .chain(folded.nfkd())
                    .any(is_default_ignorable),
                "U+{:04X} decomposes or folds into a default-ignorable code point",
                u32::from(c)
            );
        }
    }
    assert_eq!((nfd, nfkc, fold), (4, 18, 3));

    // Past the bound, the sequences that compose most (3 characters into a
    // 2-byte one; Hangul's 3 jamo into one syllable; Greek's 4 into one)
    // normalize to more than an undigested `email|…` key holds.
    for unit in [
        "U\u{308}\u{304}",
        "\u{1100}\u{1161}\u{11a8}",
        "\u{3b1}\u{313}\u{300}\u{345}",
        "\u{3b9}\u{308}\u{301}",
    ] {
        let units = unit.chars().count();
        let input = unit.repeat(Key::MAX_INPUT_CHARS / units + 1);
        let normalized = before_the_bound::normalize_identity(&input);
        assert!(
            normalized.len() > Key::MAX_BYTES - "email|".len(),
            "{unit:?}: {} bytes",
            normalized.len()
        );
    }
}

/// A key as an operator types it, `kind:value`, is the key the service
/// counts: each kind normalized by its constructor, the value read whole
/// (a `:` in it included); another kind, no kind or a bad address is
/// `InvalidKey`.
#[test]
fn an_operators_key_is_the_services_key() {
    let parsed = |typed: &str| typed.parse::<Key>();
    assert_eq!(
        parsed("email: ALICE@example.com").unwrap(),
        Key::email("alice@example.com")
    );
    assert_eq!(parsed("user:Straße").unwrap(), Key::username("STRASSE"));
    assert_eq!(parsed("id:a:b|c").unwrap(), Key::opaque("a:b|c"));
    // The kind in any case, as support staff type it.
    assert_eq!(parsed(" Email:Alice").unwrap(), Key::email("alice"));
    let v4: IpAddr = "192.0.2.7".parse().unwrap();
    assert_eq!(parsed("ip:::ffff:192.0.2.7").unwrap(), Key::ip(v4));
    let v6: IpAddr = "2001:db8:1:2::9".parse().unwrap();
    assert_eq!(parsed("ip: 2001:db8:1:2::9 ").unwrap(), Key::ip(v6));
    for bad in ["alice", "mail:alice", "ip:", "ip:300.0.0.1", ":x", ""] {
        let err = parsed(bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{bad:?}");
    }
}

// ---------------------------------------------------------------------------
// Spellings of one identity: what an account lookup equates, one key
// ---------------------------------------------------------------------------

/// Default-ignorable code points a form carries unseen: zero-width space,
/// soft hyphen, byte order mark, word joiner, zero-width joiner, combining
/// grapheme joiner, a variation selector.
const ZERO_WIDTH: [char; 7] = [
    '\u{200B}', '\u{00AD}', '\u{FEFF}', '\u{2060}', '\u{200D}', '\u{034F}', '\u{FE0F}',
];

/// The bidirectional controls, default-ignorable too: the marks, the
/// embeddings and overrides, the isolates.
const BIDI_CONTROLS: [char; 11] = [
    '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}',
    '\u{2067}', '\u{2068}', '\u{2069}',
];

/// A default-ignorable code point: mostly the ones above, else any, as
/// `regex-syntax`'s Unicode tables (through proptest) list them, apart
/// from the crate's own table.
fn default_ignorable() -> impl Strategy<Value = char> {
    let any = proptest::string::string_regex(r"\p{Default_Ignorable_Code_Point}")
        .expect("a Unicode property regex")
        .prop_map(|s| s.chars().next().expect("one character"));
    prop_oneof![
        2 => prop::sample::select(ZERO_WIDTH.to_vec()),
        2 => prop::sample::select(BIDI_CONTROLS.to_vec()),
        1 => any,
    ]
}

/// `c` in one of the forms a key unifies with it, chosen by `form`: itself,
/// either case, full-width, circled, mathematical bold, the Kelvin sign
/// for a `k`. A form `c` has none of is `c`.
fn form_of(c: char, form: u8) -> char {
    let single = |s: String| -> Option<char> {
        let mut chars = s.chars();
        let first = chars.next()?;
        chars.next().is_none().then_some(first)
    };
    let upper = single(c.to_uppercase().collect()).unwrap_or(c);
    let lower = single(c.to_lowercase().collect()).unwrap_or(c);
    let offset = |from: char, to: u32| char::from_u32(u32::from(c) - u32::from(from) + to);
    let other = match form {
        1 => Some(upper),
        2 => Some(lower),
        3 | 4 if ('!'..='~').contains(&c) => {
            let c = if form == 4 { upper } else { c };
            char::from_u32(u32::from(c) - 0x21 + 0xFF01)
        }
        5 if c.is_ascii_lowercase() => offset('a', 0x24D0),
        5 if c.is_ascii_uppercase() => offset('A', 0x24B6),
        6 if c.is_ascii_lowercase() => offset('a', 0x1D41A),
        6 if c.is_ascii_uppercase() => offset('A', 0x1D400),
        6 if c.is_ascii_digit() => offset('0', 0x1D7CE),
        7 if c.eq_ignore_ascii_case(&'k') => Some('\u{212A}'),
        _ => None,
    };
    other.unwrap_or(c)
}

/// A spelling of `base` that the key promises is `base`: each character
/// in one of its forms ([`form_of`]), and up to 5 default-ignorable code
/// points anywhere, the ends included.
fn spelling_of(base: &'static str) -> impl Strategy<Value = String> {
    let n = base.chars().count();
    (
        prop::collection::vec(0_u8..10, n),
        prop::collection::vec((0..=n, default_ignorable()), 0..=5),
    )
        .prop_map(move |(forms, ignorables)| {
            let mut out: Vec<char> = base
                .chars()
                .zip(forms)
                .map(|(c, form)| form_of(c, form))
                .collect();
            // From the back, so that each index is still where it was meant.
            let mut ignorables = ignorables;
            ignorables.sort_by_key(|&(at, _)| std::cmp::Reverse(at));
            for (at, c) in ignorables {
                out.insert(at, c);
            }
            out.into_iter().collect()
        })
}

/// Each of the characters a form carries unseen, anywhere in an address,
/// once or between every two characters, is dropped: the address's key,
/// and the name's.
#[test]
fn each_zero_width_character_anywhere_in_an_address_is_dropped() {
    each_anywhere_is_dropped(&ZERO_WIDTH);
}

/// So is each bidirectional control (the marks, embeddings, overrides and
/// isolates), which can make an address read as another.
#[test]
fn each_bidirectional_control_anywhere_in_an_address_is_dropped() {
    each_anywhere_is_dropped(&BIDI_CONTROLS);
}

fn each_anywhere_is_dropped(ignorables: &[char]) {
    let base = "alice@example.com";
    let (email, user) = (Key::email(base), Key::username(base));
    assert_eq!(email.as_str(), "email|alice@example.com");
    for &c in ignorables {
        let mut spellings: Vec<String> = (0..=base.len())
            .map(|at| {
                let mut s = base.to_owned();
                s.insert(at, c);
                s
            })
            .collect();
        spellings.push(base.chars().flat_map(|b| [c, b]).chain([c]).collect());
        for spelling in &spellings {
            let shown = format!("U+{:04X} in {spelling:?}", u32::from(c));
            assert_eq!(Key::email(spelling), email, "{shown}");
            assert_eq!(Key::username(spelling), user, "{shown}");
        }
    }
}

/// An address of default-ignorable code points alone is the empty address,
/// as one of white space alone is: `email|`.
#[test]
fn an_address_of_default_ignorables_alone_is_the_empty_address() {
    let empty = Key::email("");
    assert_eq!(empty.as_str(), "email|");
    assert_eq!(Key::email("   "), empty);
    for only in [
        "\u{200B}",
        "\u{FEFF}\u{2066}\u{00AD}",
        " \u{200D} \u{202E} ",
    ] {
        assert_eq!(Key::email(only), empty, "{only:?}");
        assert_eq!(Key::username(only), Key::username(""), "{only:?}");
    }
}

/// The crate's table of default-ignorable code points is Unicode's
/// property, over every scalar value (as `regex-syntax` has it).
#[test]
fn the_default_ignorable_table_is_unicodes_property() {
    for c in (0..=0x10ffff).filter_map(char::from_u32) {
        assert_eq!(
            is_default_ignorable(c),
            unicode_default_ignorable(c),
            "U+{:04X}",
            u32::from(c)
        );
    }
}

/// An identity and the same with default-ignorable code points inserted
/// anywhere.
fn sprinkled(
    base: impl Strategy<Value = String>,
    ignorables: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = (String, String)> {
    (
        base,
        prop::collection::vec(
            (any::<prop::sample::Index>(), default_ignorable()),
            ignorables,
        ),
    )
        .prop_map(|(base, ignorables)| {
            let mut chars: Vec<char> = base.chars().collect();
            for (at, c) in ignorables {
                chars.insert(at.index(chars.len() + 1), c);
            }
            (base, chars.into_iter().collect())
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: crate::common::cases(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Default-ignorable code points inserted anywhere into any address or
    /// name leave its key.
    #[test]
    fn default_ignorables_sprinkled_into_an_identity_leave_its_key(
        (base, spelling) in sprinkled(identity(0..=40), 1..=6),
    ) {
        prop_assert_eq!(Key::email(&spelling), Key::email(&base));
        prop_assert_eq!(Key::username(&spelling), Key::username(&base));
        let normalized = platformkit_limit::internal::normalize_identity(&spelling);
        prop_assert!(!normalized.chars().any(is_default_ignorable), "{normalized:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Each case normalizes about 1600 characters twice.
        cases: crate::common::cases(24),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Default-ignorable code points do not count toward the bound: around
    /// it, inserted anywhere, they leave the key, cut or not.
    #[test]
    fn default_ignorables_do_not_count_toward_the_bound(
        (base, spelling) in sprinkled(
            prop_oneof![
                identity(Key::MAX_INPUT_CHARS - 8..=Key::MAX_INPUT_CHARS + 8),
                narrow_identity(Key::MAX_INPUT_CHARS - 8..=Key::MAX_INPUT_CHARS + 8),
            ],
            1..=40,
        ),
    ) {
        prop_assert_eq!(Key::email(&spelling), Key::email(&base));
        prop_assert_eq!(Key::username(&spelling), Key::username(&base));
    }
}

/// However many default-ignorable code points, wherever: a key steps over
/// them (one test a character, nothing kept), drops them, and is not cut
/// by them; 1600 characters with one between each two are the key of the
/// 1600 characters, and 1601 are cut as 1601 are.
#[test]
fn default_ignorables_however_many_leave_the_key_and_never_cut_it() {
    let alice = Key::email("alice@example.com");
    let many = repeat('\u{200B}', 1 << 18);
    for spelling in [
        format!("{many}alice@example.com"),
        format!("alice@{many}example.com"),
        format!("alice@example.com{many}"),
        format!("{many} \u{FEFF} Alice@Example.com \u{2060}{many} "),
    ] {
        assert_eq!(Key::email(&spelling), alice);
    }
    assert!(!alice.is_digested());

    let n = Key::MAX_INPUT_CHARS;
    let interleaved = |k: usize| "a\u{200B}".repeat(k);
    assert_eq!(Key::email(&interleaved(n)), Key::email(&repeat('a', n)));
    assert_eq!(
        Key::email(&interleaved(n + 1)),
        Key::email(&repeat('a', n + 1))
    );
    assert_ne!(Key::email(&interleaved(n)), Key::email(&interleaved(n + 1)));
}

/// Addresses and names to spell: ASCII ones, one with the characters an
/// address is made of (`.`, `+`, `_`, `-`, digits), a `k` for the Kelvin
/// sign, and a Greek name whose final sigma folds.
const IDENTITIES: [&str; 6] = [
    "alice@example.com",
    "bob.smith+tag@mail.example.org",
    "kelvin_99-x@example.net",
    "alice",
    "Fiona",
    "Σίσυφος",
];

/// What PostgreSQL's documented case-insensitive ICU collation
/// (`und-u-ks-level2`, nondeterministic), as many accounts tables use,
/// says is one address or one name, is one [`Key::email`] and one
/// [`Key::username`]: over spellings in every case, width and
/// compatibility form, with default-ignorable code points (zero-width,
/// bidirectional controls) anywhere. Else each spelling that finds the
/// account is a count of its own, and a limit of 5 guesses is 5 per
/// spelling. The server compares every pair of spellings in one statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_a_case_insensitive_collation_equates_are_one_key() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    const PER_IDENTITY: usize = 150;

    let db = platformkit_limit_testdb::Server::shared()
        .empty_database()
        .await;
    let client = db.connect().await;
    // Fails, and so does the test, on a server built without ICU.
    client
        .batch_execute(
            "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', \
             deterministic = false)",
        )
        .await
        .expect("creating PostgreSQL's case-insensitive ICU collation");

    let mut runner = TestRunner::deterministic();
    let mut spellings: Vec<String> = Vec::new();
    for base in IDENTITIES {
        spellings.push(base.to_owned());
        let strategy = spelling_of(base);
        for _ in 0..PER_IDENTITY {
            let tree = strategy.new_tree(&mut runner).expect("a spelling");
            spellings.push(tree.current());
        }
    }
    let rows = client
        .query(
            "SELECT a.i, b.i \
             FROM unnest($1::text[]) WITH ORDINALITY AS a(s, i) \
             JOIN unnest($1::text[]) WITH ORDINALITY AS b(s, i) \
               ON a.i < b.i AND a.s = b.s COLLATE ci",
            &[&spellings],
        )
        .await
        .expect("comparing every pair of spellings");
    let equated: Vec<(usize, usize)> = rows
        .iter()
        .map(|row| {
            let at = |col: usize| usize::try_from(row.get::<_, i64>(col) - 1).expect("an index");
            (at(0), at(1))
        })
        .collect();

    // Not vacuous: the server equates each identity with most of its
    // spellings (not all: it does not ignore every default-ignorable code
    // point, the Hangul fillers and unassigned tags among them).
    for (i, base) in IDENTITIES.iter().enumerate() {
        let at = i * (PER_IDENTITY + 1);
        let with_base = equated.iter().filter(|&&(a, _)| a == at).count();
        assert!(
            with_base >= PER_IDENTITY / 2,
            "the server equates only {with_base} of {PER_IDENTITY} spellings with {base:?}"
        );
    }

    let mut apart = Vec::new();
    for &(a, b) in &equated {
        let (a, b) = (spellings[a].as_str(), spellings[b].as_str());
        for (what, key) in [
            ("email", Key::email as fn(&str) -> Key),
            ("username", Key::username),
        ] {
            let (ka, kb) = (key(a), key(b));
            if ka != kb {
                apart.push(format!(
                    "{what}: the server equates {a:?} and {b:?}, keys {:?} and {:?}",
                    ka.as_str(),
                    kb.as_str()
                ));
            }
        }
    }
    assert!(
        apart.is_empty(),
        "{} of {} pairs the server equates are two keys (email and username counted \
         apart); the first:\n{}",
        apart.len(),
        2 * equated.len(),
        apart[..apart.len().min(5)].join("\n")
    );
}

/// A key's one spelling, shown and typed (`Key::spelling`, `FromStr`), and
/// a stored key read back (`Key::from_encoded`).
mod spelling {
    use super::is_default_ignorable;
    use platformkit_limit::{ErrorKind, Key};

    /// Whether `c` shows as nothing or as a plain space: a spelling writes it `\u{…}`.
    fn unseen(c: char) -> bool {
        is_default_ignorable(c) || (c.is_whitespace() && c != ' ') || c == '\u{2800}'
    }

    #[test]
    fn from_encoded_gives_back_every_key() {
        let long = "a|~\\".repeat(300);
        let keys = [
            Key::email("Alice@Example.com"),
            Key::username("<script>alert(1)</script>"),
            Key::opaque("a|b~c\\d\u{0}e\u{7f}"),
            Key::ip("203.0.113.7".parse().unwrap()),
            Key::new(["", "", ""]).unwrap(),
            Key::opaque(&long),
            Key::email(&long),
        ];
        assert!(keys[5].is_digested() && keys[6].is_digested());
        for key in keys {
            assert_eq!(Key::from_encoded(key.as_str()), Some(key));
        }
    }

    #[test]
    fn from_encoded_refuses_what_no_key_encodes_to() {
        let digest = "0".repeat(64);
        for text in [
            "id|\\x41".to_owned(), // `A`, which is written as itself
            "id|\\a".to_owned(),   // no such escape
            "id|a\\".to_owned(),   // a bare backslash at the end
            "id|\\x0G".to_owned(), // not hex
            "id|\\x0A".to_owned(), // uppercase hex is never written
            "id|a~".to_owned(),    // a digest marker and no digest
            format!("id|a~{}", &digest[1..]),
            format!("id|a~{}", digest.to_uppercase().replace('0', "A")),
            format!("id|a~{digest}x"),
            format!("id|a~{digest}~{digest}"),
            format!("id|{}", "a".repeat(Key::MAX_BYTES)),
        ] {
            assert_eq!(Key::from_encoded(&text), None, "{text:?}");
        }
        let digested = format!("id|a~{digest}");
        assert_eq!(
            Key::from_encoded(&digested).map(|k| k.is_digested()),
            Some(true)
        );
    }

    /// Keys of every constructor, and of `Key::new` with parts that read as another form.
    fn keys_of_every_shape() -> Vec<Key> {
        let new = |parts: &[&str]| Key::new(parts).unwrap();
        vec![
            Key::email("Alice@Example.com"),
            Key::username("bob"),
            Key::opaque("a|b~c\\d\u{0}e\u{7f}"),
            Key::opaque(" padded "),
            Key::opaque("alice\u{200B}"),
            Key::opaque("\u{202E}moc.elpmaxe@ecila"),
            Key::opaque("\u{A0}\u{3000}\u{2800}\u{FEFF}"),
            Key::opaque(r"\u{20}"),
            Key::ip("203.0.113.7".parse().unwrap()),
            Key::ip("2001:db8:1:2::9".parse().unwrap()),
            Key::ip_grouped("2001:db8::1".parse().unwrap(), 48).unwrap(),
            new(&["account", "42", "203.0.113.7"]),
            new(&["alice@example.com"]),
            new(&["203.0.113.7"]),
            new(&["alice"]),
            new(&[""]),
            new(&["", "", ""]),
            new(&["email:alice@example.com", "x"]),
            new(&["ID:7", "x"]),
            new(&["key:id|a"]),
            new(&[" ", " "]),
            Key::opaque(&"a|~\\\u{200B}".repeat(100)),
            new(&["alice\u{200B} ".repeat(100).as_str()]),
            Key::email(&"alice".repeat(100)),
        ]
    }

    /// Its spelling also shows nothing unseen.
    #[test]
    fn every_key_reads_back_from_its_spelling() {
        for key in keys_of_every_shape() {
            assert_spelled_plainly_and_read_back(&key);
        }
    }

    #[track_caller]
    fn assert_spelled_plainly_and_read_back(key: &Key) {
        let spelled = key.spelling();
        assert!(!spelled.contains(unseen), "{spelled:?}");
        assert_eq!(spelled.trim(), spelled, "no white space at either end");
        let read = spelled.parse::<Key>();
        assert_eq!(read.as_ref().ok(), Some(key), "{spelled:?}: {read:?}");
    }

    proptest::proptest! {
        #[test]
        fn every_key_of_any_parts_reads_back_from_its_spelling(
            parts in proptest::collection::vec(part(), 1..4)
        ) {
            assert_spelled_plainly_and_read_back(&Key::new(parts).unwrap());
        }
    }

    /// A part of a few characters, mostly ones that read as another form or show as nothing.
    fn part() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let c = prop_oneof![
            3 => proptest::sample::select(vec![
                'a', 'e', 'i', 'd', 'k', 'y', 'u', '@', ':', '|', '\\', '~', ' ', '{', '}', '2',
                '0', '\0', '\u{200B}', '\u{202E}', '\u{A0}', '\u{2800}', '\u{3000}', 'é',
            ]),
            1 => any::<char>(),
        ];
        proptest::collection::vec(c, 0..8).prop_map(|cs| cs.into_iter().collect())
    }

    #[test]
    fn keys_that_differ_only_by_unseen_characters_are_spelled_apart() {
        let plain = Key::opaque("alice@example.com");
        let cases = [
            ("alice@example.com\u{200B}", r"id|alice@example.com\u{200b}"),
            ("alice@exam\u{200D}ple.com", r"id|alice@exam\u{200d}ple.com"),
            ("\u{202E}alice@example.com", r"id|\u{202e}alice@example.com"),
            ("alice@example.com\u{A0}", r"id|alice@example.com\u{a0}"),
            ("alice@example.com ", r"id|alice@example.com\u{20}"),
        ];
        for (id, spelled) in cases {
            let key = Key::opaque(id);
            assert_ne!(key, plain);
            assert_eq!(key.spelling(), spelled);
        }
    }

    /// The kind forms stay as they were.
    #[test]
    fn an_address_typed_alone_is_the_services_key() {
        let parsed = |typed: &str| typed.parse::<Key>().unwrap();
        assert_eq!(parsed("alice@example.com"), Key::email("alice@example.com"));
        assert_eq!(
            parsed(" Alice@Example.COM\n"),
            Key::email("alice@example.com")
        );
        assert_eq!(parsed("a+tag@example.com"), Key::email("a+tag@example.com"));
        for ip in ["203.0.113.7", "2001:db8:1:2::9", "::ffff:203.0.113.7"] {
            assert_eq!(parsed(ip), Key::ip(ip.parse().unwrap()), "{ip}");
        }
        assert_eq!(parsed("id:a:b|c"), Key::opaque("a:b|c"));
        assert_eq!(
            parsed("email:a|b@example.com"),
            Key::email("a|b@example.com")
        );
    }

    /// A shown key no key is shown as is told to copy it whole.
    #[test]
    fn a_text_in_no_form_is_told_the_forms() {
        for typed in [
            "alice",
            "",
            "  ",
            "phone:555",
            "alice@",
            "@example.com",
            "a@b@c",
            "a b@c",
        ] {
            let e = typed.parse::<Key>().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidKey, "{typed:?}");
            let said = e.to_string();
            for form in [
                "email address",
                "IP address",
                "email|alice@example.com",
                "user:bob",
            ] {
                assert!(said.contains(form), "{typed:?}: {said}");
            }
        }
        for typed in [
            "email|a~b",
            r"id|\q",
            r"id|\u{41}",
            r"id|\u{200b",
            "key:id|a\\",
        ] {
            let said = typed.parse::<Key>().unwrap_err().to_string();
            assert!(said.contains("copy the key whole"), "{typed:?}: {said}");
        }
    }
}
