//! [`Key`]: who or what a limit counts, encoded so that PostgreSQL always
//! accepts it. The encoding is documented on [`Key`].

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use unicode_normalization::UnicodeNormalization;

use snafu::ensure;

mod encode;
mod ignorable;
mod operator;

#[cfg(feature = "internal-checks")]
pub use self::encode::decode;
use self::encode::{Encoder, unescaped_tilde};
pub use self::ignorable::is_default_ignorable;

use crate::Error;
use crate::error::InvalidKeySnafu;

/// Who or what a limit counts: an account, an address, a code.
///
/// Build it from parts with [`Key::new`], or with a constructor for a common
/// subject. Its `Debug` form does not show the key: keys are personal data.
///
/// ```
/// use platformkit_limit::Key;
///
/// let key = Key::new(["account", "42"])?;
/// assert_eq!(key.as_str(), "account|42");
///
/// // The separator inside a part cannot fake a second part.
/// let tricky = Key::new(["account|42"])?;
/// assert_eq!(tricky.as_str(), r"account\|42");
/// assert_ne!(key, tricky);
/// # Ok::<(), platformkit_limit::Error>(())
/// ```
///
/// | constructor | the key | normalizes |
/// |---|---|---|
/// | [`Key::new`] | the parts, escaped and joined | nothing |
/// | [`Key::opaque`] | `id\|<id>` | nothing |
/// | [`Key::email`] | `email\|<address>` | trims white space; drops default-ignorable code points; NFKC and full case folding, to a fixed point |
/// | [`Key::username`] | `user\|<name>` | as `email` |
/// | [`Key::ip`], [`Key::ip_grouped`] | `ip\|<address or network>` | IPv4-mapped IPv6 to IPv4; other IPv6 to its /64 (or the prefix given) |
///
/// # The encoding
///
/// A key is a list of parts (for example the subject's kind and the subject).
/// Each part is escaped and the parts are joined with `|`:
///
/// | in a part                                   | becomes         |
/// |---------------------------------------------|-----------------|
/// | `\`                                         | `\\`            |
/// | `\|` (the separator)                        | `\\|`           |
/// | `~` (the digest marker)                     | `\~`            |
/// | a control character (U+0000–U+001F, U+007F–U+009F) | `\xHH`   |
/// | anything else                               | itself          |
///
/// When the result is longer than [`Key::MAX_BYTES`], it is cut to a readable
/// prefix (never inside an escape) followed by `~` and the SHA-256 of the
/// whole encoding in hex.
///
/// The result is valid UTF-8 with no NUL and no control character, and at
/// most [`Key::MAX_BYTES`] long, so it is always a valid `text` value and a
/// valid btree index entry. The encoding is injective: two different part
/// lists never give the same key (short of a SHA-256 collision), because
/// escaping is reversible, an unescaped `|` only ever separates parts, and an
/// unescaped `~` only ever introduces a digest.
///
/// The limiter puts the limit's name in front (`name|…`), so the same key
/// under two limits is two counters.
///
/// # Bounded work
///
/// A key reads at most [`Key::MAX_INPUT_CHARS`] characters of its input
/// (of the parts together, each `|` between them counted as one; of an
/// address or a name, after its leading white space, the default-ignorable
/// code points it drops not counted), so normalizing and encoding cost what
/// that prefix costs, however long the input; beyond it, [`Key::email`] and
/// [`Key::username`] only step over the white space at either end and the
/// default-ignorable code points anywhere (one test a character, nothing
/// kept), to trim and drop them as they would anyway. An input with more is
/// *cut*: its key is the digest form above, always, over the encoding of
/// what was read followed by a NUL byte (which no encoding contains), so it
/// is never the key of an input that was not cut. Two inputs cut alike, the same first
/// [`Key::MAX_INPUT_CHARS`] characters, are one key whatever follows. White
/// space and default-ignorable code points after the prefix, and nothing
/// else, are no cut: [`Key::email`] and [`Key::username`] trim and drop
/// them, as they do in any input.
///
/// Every input within the bound (at most [`Key::MAX_INPUT_CHARS`]
/// characters, counted as above) has the key it would have without the
/// bound, and so does every input whose key without the bound is not
/// digested:
///
/// - [`Key::new`] and [`Key::opaque`] write at least one byte per character,
///   so an input past the bound is over [`Key::MAX_BYTES`] and would be
///   digested anyway.
/// - [`Key::email`] and [`Key::username`] normalize, and normalization can
///   shorten: canonical composition puts up to 4 characters into one (the
///   longest canonical decomposition, as of `U+1F82`), and NFKC, case
///   folding and the repeated rounds compose no further than that, since
///   neither lowers the number of characters of the full compatibility
///   decomposition; and no character decomposes or folds into a
///   default-ignorable code point unless it is one, so none of the
///   characters counted is dropped. So an address of `n` characters
///   (counted as above) normalizes to at least `(n - 288) / 4` characters
///   (288: what the trims of the at most 8 rounds can take, at most 18
///   characters at each end a round), and one of more than 1064 characters
///   to more than the 194 bytes an undigested `email|…` key has room for. The bound, 1600, leaves a margin over that.
/// - The cost of the prefix is bounded too: NFKC expands a character to at
///   most 18 (`U+FDFA`), and full case folding to at most 3.
///
/// The tests check each of these factors over every Unicode scalar value.
///
/// **The encoding is part of the stored data.** Changing it changes every
/// stored key, which silently resets every counter on deploy; the golden
/// vectors in the tests pin it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    encoded: Box<str>,
}

impl Key {
    /// The longest encoded key, in bytes (without the limit's name).
    pub const MAX_BYTES: usize = 200;

    /// The most characters of its input a key reads: 1600, eight times
    /// [`Key::MAX_BYTES`]. Past it, the key is digested from what was read
    /// (see [bounded work](Key#bounded-work)).
    pub const MAX_INPUT_CHARS: usize = 8 * Key::MAX_BYTES;

    /// A key made of `parts`, in order.
    ///
    /// Any string is accepted as a part, including empty ones and ones with
    /// NUL, control characters or the separator. At most
    /// [`Key::MAX_INPUT_CHARS`] characters of the parts are read
    /// ([bounded work](Key#bounded-work)).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) when there are
    /// no parts.
    pub fn new<I, S>(parts: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut encoder = Encoder::default();
        for part in parts {
            if !encoder.read(part.as_ref()) {
                break;
            }
        }
        ensure!(
            encoder.parts > 0,
            InvalidKeySnafu {
                reason: "a key needs at least one part"
            }
        );
        Ok(encoder.finish(false))
    }

    /// An opaque identifier used exactly as given (no trimming, no case
    /// folding): the key `id|<id>`.
    ///
    /// ```
    /// use platformkit_limit::Key;
    /// assert_eq!(Key::opaque("Order-7").as_str(), "id|Order-7");
    /// ```
    pub fn opaque(id: &str) -> Self {
        let mut encoder = Encoder::default();
        encoder.read("id");
        encoder.read(id);
        encoder.finish(false)
    }

    /// An email address, normalized so that one mailbox's spellings are one
    /// key: `email|<normalized>`.
    ///
    /// Normalization: surrounding white space is trimmed; default-ignorable
    /// code points (zero-width spaces and joiners, the soft hyphen, the byte
    /// order mark, variation selectors, bidirectional controls: characters
    /// that show as nothing) are dropped; the address is put in Unicode
    /// normalization form KC and case-folded (full Unicode case folding, so
    /// `Alice@Example.COM`, `ALICE@example.com` and the full-width
    /// `ＡＬＩＣＥ@example.com` are one key), repeated until it no longer
    /// changes. So case, width and compatibility forms, and invisible
    /// characters, are one key; an address of invisible characters alone is
    /// the empty address.
    ///
    /// Not folded, because they are different mailboxes at some providers:
    /// dots in the local part (`a.lice@` is not `alice@`), plus tags
    /// (`alice+x@` is not `alice@`), and an internationalized domain in
    /// Unicode versus its Punycode (`xn--`) form. Accents (`alicé`) and
    /// homoglyphs from other scripts (a Cyrillic `а` for a Latin `a`) are
    /// different characters and stay different keys. A collation may equate
    /// more than this: ICU's case-insensitive one also ignores control
    /// characters and many combining marks, so where the account lookup
    /// uses one, key by the account it finds. The address is not
    /// validated: any string is a key.
    ///
    /// ```
    /// use platformkit_limit::Key;
    ///
    /// assert_eq!(Key::email(" Alice@Example.COM "), Key::email("alice@example.com"));
    /// assert_eq!(Key::email("alice@exam\u{200B}ple.com"), Key::email("alice@example.com"));
    /// assert_eq!(Key::email("alice@example.com").as_str(), "email|alice@example.com");
    /// assert_ne!(Key::email("alice+x@example.com"), Key::email("alice@example.com"));
    /// ```
    pub fn email(address: &str) -> Self {
        Self::normalized("email", address)
    }

    /// A username, normalized as [`Key::email`] normalizes an address:
    /// trimmed, default-ignorable code points dropped, NFKC, case-folded;
    /// so case, width and compatibility forms and invisible characters are
    /// one key, accents and homoglyphs are not. `user|<normalized>`.
    ///
    /// ```
    /// use platformkit_limit::Key;
    ///
    /// assert_eq!(Key::username("Straße"), Key::username("STRASSE"));
    /// assert_eq!(Key::username("ﬁona").as_str(), "user|fiona");
    /// assert_eq!(Key::username("\u{202E}fiona\u{2066}"), Key::username("fiona"));
    /// ```
    pub fn username(name: &str) -> Self {
        Self::normalized("user", name)
    }

    /// An IP address, grouped the way one attacker holds addresses: an IPv4
    /// address is itself; an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is
    /// the IPv4 address; any other IPv6 address stands for its /64 network.
    ///
    /// ```
    /// use platformkit_limit::Key;
    /// use std::net::IpAddr;
    ///
    /// let v4: IpAddr = "192.0.2.7".parse().unwrap();
    /// let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
    /// assert_eq!(Key::ip(v4), Key::ip(mapped));
    /// assert_eq!(Key::ip(v4).as_str(), "ip|192.0.2.7");
    ///
    /// let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
    /// let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
    /// assert_eq!(Key::ip(a), Key::ip(b));
    /// assert_eq!(Key::ip(a).as_str(), "ip|2001:db8:1:2::/64");
    /// ```
    pub fn ip(addr: IpAddr) -> Self {
        Self::ip_grouped(addr, 64).expect("64 is a valid IPv6 prefix length")
    }

    /// Like [`Key::ip`], with IPv6 addresses grouped by a prefix of
    /// `v6_prefix` bits (1 to 128) instead of 64.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) when
    /// `v6_prefix` is 0 or above 128.
    pub fn ip_grouped(addr: IpAddr, v6_prefix: u8) -> Result<Self, Error> {
        ensure!(
            (1..=128).contains(&v6_prefix),
            InvalidKeySnafu {
                reason: "an IPv6 prefix length is between 1 and 128"
            }
        );
        let text = match addr {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4.to_string(),
                None => {
                    let bits = u128::from(v6);
                    let mask = u128::MAX << (128 - u32::from(v6_prefix));
                    format!("{}/{v6_prefix}", Ipv6Addr::from(bits & mask))
                }
            },
        };
        Ok(Self::from_two("ip", &text))
    }

    /// `kind|<subject>`, the subject read whole: an address, a network.
    fn from_two(kind: &str, subject: &str) -> Self {
        let mut encoder = Encoder::default();
        encoder.whole(kind);
        encoder.whole(subject);
        encoder.finish(false)
    }

    /// `kind|<the normalized input>`, normalizing at most
    /// [`Key::MAX_INPUT_CHARS`] characters of the input after its leading
    /// white space, default-ignorable code points dropped and not counted;
    /// cut when anything but white space and those follows them.
    fn normalized(kind: &str, input: &str) -> Self {
        let skipped = |c: char| c.is_whitespace() || is_default_ignorable(c);
        let mut head = String::new();
        let mut rest = "";
        let mut read = 0;
        let input = input.trim_start_matches(skipped);
        for (i, c) in input.char_indices() {
            if is_default_ignorable(c) {
                continue;
            }
            if read == Key::MAX_INPUT_CHARS {
                rest = &input[i..];
                break;
            }
            head.push(c);
            read += 1;
        }
        let cut = !rest.trim_end_matches(skipped).is_empty();
        let mut encoder = Encoder::default();
        encoder.whole(kind);
        encoder.whole(&normalize_identity(&head));
        encoder.finish(cut)
    }

    /// The encoded key, as stored (without the limit's name).
    pub fn as_str(&self) -> &str {
        &self.encoded
    }

    /// Whether the key was too long and ends in a digest.
    pub fn is_digested(&self) -> bool {
        unescaped_tilde(&self.encoded).is_some()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(<{} bytes, not shown>)", self.encoded.len())
    }
}

/// Trims, drops default-ignorable code points, applies NFKC and full case
/// folding, until nothing changes.
///
/// One round of NFKC and case folding is not always closed (folding can
/// produce a sequence that NFKC composes differently), so the rounds repeat
/// until a fixed point; in practice that is one or two. Each round drops
/// default-ignorable code points first, and NFKC and folding never make one
/// of another character, so none is left. ASCII has none.
#[doc(hidden)]
pub fn normalize_identity(input: &str) -> String {
    let trimmed = input.trim();
    if trimmed.is_ascii() {
        return trimmed.to_ascii_lowercase();
    }
    let mut current = trimmed.to_owned();
    for _ in 0..8 {
        let kept: String = current
            .chars()
            .filter(|&c| !is_default_ignorable(c))
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

/// The stored form of `key` under `limit_name`.
pub(crate) fn stored(limit_name: &str, key: &Key) -> String {
    let mut out = String::with_capacity(limit_name.len() + 1 + key.encoded.len());
    out.push_str(limit_name);
    out.push('|');
    out.push_str(&key.encoded);
    out
}
