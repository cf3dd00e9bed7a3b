//! A [`Key`] as an operator reads and types it, and a stored key back as a [`Key`].

use std::fmt::Write as _;
use std::net::IpAddr;

use super::encode::{decode, escape_into, unescaped_tilde};
use super::{Key, is_default_ignorable};
use crate::Error;
use crate::error::InvalidKeySnafu;

impl Key {
    /// The key whose encoding is `encoded` (as [`KeyStatus::key`](crate::KeyStatus::key) shows
    /// it); `None` unless [`Key`] could have written it (a digest is checked for its shape).
    ///
    /// ```
    /// use platformkit_limit::Key;
    ///
    /// let alice = Key::email("Alice@Example.com");
    /// assert_eq!(Key::from_encoded(alice.as_str()), Some(alice));
    /// assert_eq!(Key::from_encoded("email|a~b"), None);
    /// ```
    pub fn from_encoded(encoded: &str) -> Option<Key> {
        if encoded.len() > Key::MAX_BYTES {
            return None;
        }
        let (prefix, digest) = match unescaped_tilde(encoded) {
            Some(at) => (&encoded[..at], Some(&encoded[at + 1..])),
            None => (encoded, None),
        };
        if let Some(digest) = digest {
            let hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
            if digest.len() != 64 || !digest.bytes().all(hex) {
                return None;
            }
        }
        let parts = decode(prefix)?;
        let mut again = String::with_capacity(prefix.len());
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                again.push('|');
            }
            escape_into(part, &mut again);
        }
        (again == prefix).then(|| Key {
            encoded: encoded.into(),
        })
    }
}

/// The kinds an operator types before a `:`: a constructor's, or `key` before a spelling.
#[derive(Clone, Copy)]
enum Kind {
    Email,
    User,
    Ip,
    Id,
    Shown,
}

const KINDS: [(&str, Kind); 5] = [
    ("email", Kind::Email),
    ("user", Kind::User),
    ("ip", Kind::Ip),
    ("id", Kind::Id),
    ("key", Kind::Shown),
];

/// What a text that is no key is told: every form an operator may type.
const FORMS: &str = "type an email address (alice@example.com), an IP address \
                     (203.0.113.7), a key as it is shown (email|alice@example.com), \
                     or a kind and a value (user:bob; the kinds are email, user, ip and id)";

/// What a text read as a shown key, which is none, is told.
const NOT_SHOWN: &str = "a text with | is read as a key is shown, and no key is shown so: \
                         copy the key whole, or type an email address, an IP address, \
                         or a kind and a value (user:bob)";

impl Key {
    /// The key as the admin page and the operator's tool show it (personal data), which
    /// [`FromStr`](#impl-FromStr-for-Key) reads back as this very key: the encoding, except that
    /// what shows as nothing or as a plain space is written `\u{…}` (so two keys never look
    /// alike), and a key that would read as another form gets `key:` in front.
    ///
    /// ```
    /// use platformkit_limit::Key;
    ///
    /// assert_eq!(Key::email("Alice@Example.com").spelling(), "email|alice@example.com");
    /// let both = Key::new(["account", "42", "203.0.113.7"])?;
    /// assert_eq!(both.spelling(), "account|42|203.0.113.7");
    /// let hidden = Key::opaque("alice\u{200B}");
    /// assert_eq!(hidden.spelling(), r"id|alice\u{200b}");
    /// let one_part = Key::new(["alice@example.com"])?;
    /// assert_eq!(one_part.spelling(), "key:alice@example.com");
    /// for key in [both, hidden, one_part] {
    ///     assert_eq!(key.spelling().parse::<Key>()?, key);
    /// }
    /// # Ok::<(), platformkit_limit::Error>(())
    /// ```
    pub fn spelling(&self) -> String {
        let encoded = self.as_str();
        let mut spelled = String::with_capacity(encoded.len());
        let last = encoded.len().saturating_sub(1);
        for (i, c) in encoded.char_indices() {
            if unseen(c) || (c == ' ' && (i == 0 || i == last)) {
                let _ = write!(spelled, "\\u{{{:x}}}", u32::from(c));
            } else {
                spelled.push(c);
            }
        }
        if !separated(&spelled) || kind(&spelled).is_some() {
            spelled.insert_str(0, "key:");
        }
        spelled
    }
}

/// A key as an operator types it:
///
/// - `email:`, `user:`, `ip:` or `id:` (any case) and a value, built by [`Key::email`],
///   [`Key::username`], [`Key::ip`] or [`Key::opaque`]: the key the service counts;
/// - a key as it is shown ([`Key::spelling`]): a text with a `|`, or any text after `key:`;
/// - an IP address alone, as [`Key::ip`];
/// - an email address alone (one `@` with text on either side, no white space or `:`), as
///   [`Key::email`]; one with a `|` in it is typed `email:…`.
///
/// ```
/// use platformkit_limit::Key;
///
/// let alice: Key = "email:Alice@Example.com".parse()?;
/// assert_eq!(alice, Key::email("alice@example.com"));
/// assert_eq!("user:bob".parse::<Key>()?, Key::username("bob"));
/// assert_eq!("ip:203.0.113.7".parse::<Key>()?.as_str(), "ip|203.0.113.7");
/// assert_eq!("id:abc123".parse::<Key>()?, Key::opaque("abc123"));
/// assert_eq!(" Email:bob@example.com".parse::<Key>()?, Key::email("bob@example.com"));
/// assert_eq!("email|alice@example.com".parse::<Key>()?, alice);
/// assert_eq!("account|42".parse::<Key>()?, Key::new(["account", "42"])?);
/// assert_eq!(" Alice@Example.com ".parse::<Key>()?, alice);
/// assert_eq!("2001:db8::7".parse::<Key>()?.as_str(), "ip|2001:db8::/64");
/// assert!("ip:not-an-address".parse::<Key>().is_err());
/// assert!("alice".parse::<Key>().is_err());
/// # Ok::<(), platformkit_limit::Error>(())
/// ```
///
/// # Errors
///
/// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey), its message naming the forms, for
/// a text in none of them, an `ip:` that is no IP address, or a shown key no key is shown as.
impl std::str::FromStr for Key {
    type Err = Error;

    fn from_str(typed: &str) -> Result<Key, Error> {
        let invalid = |reason| Error::from(InvalidKeySnafu { reason }.build());
        let typed = typed.trim_start();
        if let Some((kind, value)) = kind(typed) {
            return match kind {
                Kind::Email => Ok(Key::email(value)),
                Kind::User => Ok(Key::username(value)),
                Kind::Id => Ok(Key::opaque(value)),
                Kind::Ip => value
                    .trim()
                    .parse::<IpAddr>()
                    .map(Key::ip)
                    .map_err(|_| invalid("an ip: key needs an IPv4 or IPv6 address")),
                Kind::Shown => spelled(value.trim()).ok_or_else(|| invalid(NOT_SHOWN)),
            };
        }
        let typed = typed.trim_end();
        if let Ok(address) = typed.parse::<IpAddr>() {
            Ok(Key::ip(address))
        } else if separated(typed) {
            spelled(typed).ok_or_else(|| invalid(NOT_SHOWN))
        } else if is_email_address(typed) {
            Ok(Key::email(typed))
        } else {
            Err(invalid(FORMS))
        }
    }
}

/// The kind `text` starts with, and the value after its `:`.
fn kind(text: &str) -> Option<(Kind, &str)> {
    let (kind, value) = text.split_once(':')?;
    KINDS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(kind))
        .map(|&(_, kind)| (kind, value))
}

/// Whether `c` shows as nothing or as a plain space: a spelling writes it `\u{…}`.
fn unseen(c: char) -> bool {
    is_default_ignorable(c) || (c.is_whitespace() && c != ' ') || c == '\u{2800}'
}

/// Whether `text` holds a `|` that is not escaped: a separator of parts.
fn separated(text: &str) -> bool {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '|' => return true,
            _ => {}
        }
    }
    false
}

/// Whether `text` reads as an email address.
fn is_email_address(text: &str) -> bool {
    let one_at = matches!(
        text.split_once('@'),
        Some((local, domain)) if !local.is_empty() && !domain.is_empty() && !domain.contains('@')
    );
    one_at && !text.contains(|c: char| c.is_whitespace() || c == ':')
}

/// The key `text` spells ([`Key::spelling`]): only the `\u{…}` escapes a spelling writes.
fn spelled(text: &str) -> Option<Key> {
    let mut encoded = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        encoded.push_str(&rest[..at]);
        let escape = &rest[at..];
        if let Some(tail) = escape.strip_prefix("\\u{") {
            let end = tail.find('}')?;
            let hex = &tail[..end];
            if !(1..=6).contains(&hex.len()) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            let c = u32::from_str_radix(hex, 16).ok().and_then(char::from_u32)?;
            if !(c == ' ' || unseen(c)) {
                return None;
            }
            encoded.push(c);
            rest = &tail[end + 1..];
        } else {
            // An escape of the encoding's, for `from_encoded` to read.
            let after = escape[1..].chars().next().map_or(0, char::len_utf8);
            encoded.push_str(&escape[..1 + after]);
            rest = &escape[1 + after..];
        }
    }
    encoded.push_str(rest);
    Key::from_encoded(&encoded)
}
