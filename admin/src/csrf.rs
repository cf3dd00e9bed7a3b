//! The guard of the unlock: a cross-site POST is refused before anything
//! is reset. Three checks, none needing a session: the token of the page,
//! `Sec-Fetch-Site`, `Origin`.

use std::fmt::Write as _;

use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use http::header::{HOST, ORIGIN};
use sha2::Sha256;

use platformkit_limit::Error;

/// The key of the unlock tokens: an HMAC-SHA256 of the limit's name and
/// the key, which only a page this router rendered carries.
pub(super) struct Guard {
    mac: Hmac<Sha256>,
}

/// Why an unlock was refused: said on the 403 page.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `Sec-Fetch-Site` was sent and is not `same-origin`.
    FetchSite,
    /// `Origin` was sent and names another host, or none (`null`).
    Origin,
    /// The token is missing, malformed, or not this router's for this key.
    Token,
}

impl Refusal {
    /// What the 403 page says.
    pub(super) fn explain(&self) -> &'static str {
        match self {
            Refusal::FetchSite => {
                "The browser says this request came from another site \
                 (Sec-Fetch-Site is not same-origin). Nothing was unlocked."
            }
            Refusal::Origin => "The request's Origin is not this site. Nothing was unlocked.",
            Refusal::Token => {
                "The form's token is missing or not valid for this key (a page of \
                 another server, or of an earlier start of this one?). Nothing was \
                 unlocked: reload the limit's page and try again."
            }
        }
    }
}

impl Guard {
    /// A guard whose key is `secret`.
    pub(super) fn new(secret: &[u8]) -> Guard {
        Guard {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"),
        }
    }

    /// A guard with 32 random bytes from the operating system as its key.
    pub(super) fn random() -> Result<Guard, Error> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| {
            Error::invalid_option(
                "secret",
                format!("the operating system gave no random bytes ({e}); give one"),
            )
        })?;
        Ok(Guard::new(&secret))
    }

    /// The MAC of unlocking `key` under the limit `limit`: the name's
    /// length first, so that no name and key run into another pair.
    fn mac(&self, limit: &str, key: &str) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(b"platformkit-limit admin unlock\0");
        mac.update(&(limit.len() as u64).to_be_bytes());
        mac.update(limit.as_bytes());
        mac.update(key.as_bytes());
        mac
    }

    /// The token a page embeds to unlock `key` under `limit`: 64 hex digits.
    pub(super) fn token(&self, limit: &str, key: &str) -> String {
        let mut hex = String::with_capacity(64);
        for byte in self.mac(limit, key).finalize().into_bytes() {
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }

    /// Whether `token` is this guard's for `key` under `limit`, compared in
    /// constant time.
    fn verifies(&self, limit: &str, key: &str, token: &str) -> bool {
        let Some(bytes) = unhex(token) else {
            return false;
        };
        self.mac(limit, key).verify_slice(&bytes).is_ok()
    }

    /// Every check of an unlock of `key` under `limit` with `token`, given
    /// the request's header fields (`authority`: the request URI's, for
    /// HTTP/2, which has no `Host`).
    pub(super) fn check(
        &self,
        headers: &HeaderMap,
        authority: Option<&str>,
        limit: &str,
        key: &str,
        token: Option<&str>,
    ) -> Result<(), Refusal> {
        if let Some(site) = headers.get("sec-fetch-site") {
            if site.as_bytes() != b"same-origin" {
                return Err(Refusal::FetchSite);
            }
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let host = headers
                .get(HOST)
                .and_then(|h| h.to_str().ok())
                .or(authority);
            let origin_host = origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://"))
                .map(|(_, host)| host);
            match (origin_host, host) {
                (Some(o), Some(h)) if o.eq_ignore_ascii_case(h) => {}
                _ => return Err(Refusal::Origin),
            }
        }
        match token {
            Some(token) if self.verifies(limit, key, token) => Ok(()),
            _ => Err(Refusal::Token),
        }
    }
}

/// The bytes of a string of an even number of hex digits.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    text.as_bytes()
        .chunks(2)
        .map(|pair| {
            let digits = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(digits, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// The MAC is HMAC-SHA256: RFC 4231's test case 2.
    #[test]
    fn the_mac_is_hmac_sha256() {
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let mut hex = String::new();
        for byte in mac.finalize().into_bytes() {
            write!(hex, "{byte:02x}").unwrap();
        }
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// A token unlocks its own key under its own limit, with its own
    /// secret, and nothing else; a name and a key cannot run together.
    #[test]
    fn a_token_is_for_one_limit_one_key_one_secret() {
        let guard = Guard::new(&[7; 32]);
        let token = guard.token("login", "email|alice@example.com");
        assert_eq!(token.len(), 64);
        assert!(guard.verifies("login", "email|alice@example.com", &token));
        assert!(guard.verifies("login", "email|alice@example.com", &token.to_uppercase()));
        assert!(!guard.verifies("login", "email|bob@example.com", &token));
        assert!(!guard.verifies("login2", "email|alice@example.com", &token));
        assert!(!guard.verifies("logi", "nemail|alice@example.com", &token));
        assert!(!Guard::new(&[8; 32]).verifies("login", "email|alice@example.com", &token));
        assert!(!guard.verifies("login", "email|alice@example.com", &token[..62]));
        assert!(!guard.verifies("login", "email|alice@example.com", "zz"));
        assert!(!guard.verifies("login", "email|alice@example.com", ""));
        assert_ne!(
            Guard::random().unwrap().token("login", "id|a"),
            Guard::random().unwrap().token("login", "id|a")
        );
    }

    fn headers(fields: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    /// Each header check on its own: absent passes (the token still
    /// decides), present must say same origin.
    #[test]
    fn the_headers_must_say_same_origin_when_sent() {
        let guard = Guard::new(&[7; 32]);
        let token = guard.token("login", "id|a");
        let check = |fields: &[(&'static str, &str)], authority| {
            guard.check(&headers(fields), authority, "login", "id|a", Some(&token))
        };
        let host = ("host", "staff.example:8080");
        assert_eq!(check(&[host], None), Ok(()));
        assert_eq!(
            check(&[host, ("sec-fetch-site", "same-origin")], None),
            Ok(())
        );
        for site in ["cross-site", "same-site", "none", ""] {
            assert_eq!(
                check(&[host, ("sec-fetch-site", site)], None),
                Err(Refusal::FetchSite),
                "{site:?}"
            );
        }
        assert_eq!(
            check(&[host, ("origin", "https://staff.example:8080")], None),
            Ok(())
        );
        assert_eq!(
            check(&[host, ("origin", "https://STAFF.example:8080")], None),
            Ok(())
        );
        assert_eq!(
            check(
                &[("origin", "https://staff.example")],
                Some("staff.example")
            ),
            Ok(())
        );
        for origin in [
            "https://evil.example",
            "https://staff.example",
            "https://staff.example:8080.evil.example",
            "null",
            "",
        ] {
            assert_eq!(
                check(&[host, ("origin", origin)], None),
                Err(Refusal::Origin),
                "{origin:?}"
            );
        }
        assert_eq!(
            check(&[("origin", "https://staff.example")], None),
            Err(Refusal::Origin)
        );
        assert_eq!(
            guard.check(&headers(&[host]), None, "login", "id|a", None),
            Err(Refusal::Token)
        );
        assert_eq!(
            guard.check(&headers(&[host]), None, "login", "id|b", Some(&token)),
            Err(Refusal::Token)
        );
    }
}
