//! [`Key`]: who or what a limit counts, and its encoding.

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

/// Who or what a limit counts: an account, an address, a code. `Debug` hides it (personal data).
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
/// # The encoding
///
/// Each part is escaped and the parts are joined with `|`; the limiter puts the limit's name in
/// front (`name|…`, [the stored key](crate::guide#one-calls-path)).
///
/// | in a part                                   | becomes         |
/// |---------------------------------------------|-----------------|
/// | `\`                                         | `\\`            |
/// | `\|` (the separator)                        | `\\|`           |
/// | `~` (the digest marker)                     | `\~`            |
/// | a control character (U+0000–U+001F, U+007F–U+009F) | `\xHH`   |
/// | anything else                               | itself          |
///
/// An encoding longer than [`Key::MAX_BYTES`] is cut to a readable prefix (never inside an
/// escape), `~` and the hex SHA-256 of the whole encoding. So every key is a valid `text` value
/// and btree entry (UTF-8, no NUL or control character, at most [`Key::MAX_BYTES`]), and the
/// encoding is injective short of a SHA-256 collision. **It is part of the stored data**:
/// changing it resets every counter on deploy (golden vectors in the tests pin it).
///
/// # Bounded work
///
/// A key reads at most [`Key::MAX_INPUT_CHARS`] characters of its input (the parts, each `|`
/// one; of an address or a name, after leading white space, default-ignorable code points not
/// counted). An input with more is *cut*: its key is the digest over what was read and a NUL
/// byte, never an uncut input's key; inputs cut alike are one key. The bound changes no key that
/// would not be digested anyway (`the_bound_rests_on_factors_that_hold_for_every_character`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    encoded: Box<str>,
}

impl Key {
    /// The longest encoded key, in bytes (without the limit's name).
    pub const MAX_BYTES: usize = 200;

    /// The most characters of its input a key reads ([bounded work](Key#bounded-work)).
    pub const MAX_INPUT_CHARS: usize = 8 * Key::MAX_BYTES;

    /// A key made of `parts`, in order; any string is a part (empty, NUL, the separator).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) when there are no parts.
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

    /// An opaque identifier used exactly as given: the key `id|<id>`.
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

    /// An email address, normalized so that case, width and compatibility forms are one key:
    /// `email|<normalized>`. Trimmed, default-ignorable code points dropped, then NFKC and full
    /// case folding to a fixed point. Not folded: dots and `+` tags in the local part, a Unicode
    /// domain versus its Punycode form, accents, homoglyphs. Not validated. Where the account
    /// lookup's collation equates more (ICU's case-insensitive one), key by the account it finds.
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

    /// A username, normalized as [`Key::email`] normalizes an address: `user|<normalized>`.
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

    /// An IP address, grouped as one attacker holds them: IPv4 (IPv4-mapped IPv6 too) itself,
    /// other IPv6 its /64 network.
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

    /// Like [`Key::ip`], with IPv6 addresses grouped by a prefix of `v6_prefix` bits, not 64.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) unless `v6_prefix` is 1 to 128.
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

    /// `kind|<the normalized input>`, within the bound ([bounded work](Key#bounded-work)).
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

/// The normalization of [`Key::email`], to a fixed point (one round is not always closed).
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
