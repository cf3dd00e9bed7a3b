//! A [`Key`] as an operator types it, and a stored key back as a [`Key`].

use std::net::IpAddr;

use super::Key;
use super::encode::{decode, escape_into, unescaped_tilde};
use crate::Error;
use crate::error::InvalidKeySnafu;

impl Key {
    /// The key whose encoding is `encoded` (as
    /// [`KeyStatus::key`](crate::KeyStatus::key) shows it), so that an
    /// operator's tool resets exactly the key it listed. `None` unless
    /// [`Key`] could have written `encoded` (a digest is checked for its
    /// shape), so the encoding stays injective.
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

/// A key as an operator writes it, `kind:value`: `email:`
/// ([`Key::email`]), `user:` ([`Key::username`]), `ip:` ([`Key::ip`]) or
/// `id:` ([`Key::opaque`]), normalized as the service does, so that the key
/// typed is the key counted.
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
/// assert!("ip:not-an-address".parse::<Key>().is_err());
/// assert!("alice@example.com".parse::<Key>().is_err());
/// # Ok::<(), platformkit_limit::Error>(())
/// ```
///
/// # Errors
///
/// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) for another
/// kind, no `:`, or an `ip:` that is no IP address.
impl std::str::FromStr for Key {
    type Err = Error;

    fn from_str(typed: &str) -> Result<Key, Error> {
        let invalid = |reason| Error::from(InvalidKeySnafu { reason }.build());
        let kinds = "an operator's key is kind:value, the kind email, user, ip or id";
        let (kind, value) = typed
            .trim_start()
            .split_once(':')
            .ok_or_else(|| invalid(kinds))?;
        match kind.to_ascii_lowercase().as_str() {
            "email" => Ok(Key::email(value)),
            "user" => Ok(Key::username(value)),
            "id" => Ok(Key::opaque(value)),
            "ip" => value
                .trim()
                .parse::<IpAddr>()
                .map(Key::ip)
                .map_err(|_| invalid("an ip: key needs an IPv4 or IPv6 address")),
            _ => Err(invalid(kinds)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key's encoding gives the key back, digested ones included.
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
}
