//! The guard of the page's actions (unlock, block, unblock): a cross-site
//! POST is refused before anything changes. Three checks, none needing a
//! session: the token of the page, `Sec-Fetch-Site`, `Origin`.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use http::header::{HOST, ORIGIN};
use http::{HeaderMap, Uri};
use sha2::Sha256;

use platformkit_limit::{Error, ManualClock};

use super::time::span;

/// How long a token acts after its page was rendered.
pub(super) const TOKEN_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// What an unlock under every limit is bound to in place of a limit's
/// name: no limit's name (a name holds only ASCII letters, digits, `_`, `-`
/// and `.`), so that its token unlocks under no single limit, nor a single
/// limit's token under every limit.
pub(super) const EVERY_LIMIT: &str = "*";

/// What a form does to a key, which its token is bound to: a token acts
/// only as its own form's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Every window and block of the key deleted.
    Unlock,
    /// The key refused for a while, whatever its count.
    Block,
    /// The key's block ended.
    Unblock,
}

impl Action {
    /// Its name, in the MAC and in the form's path.
    pub(super) fn name(self) -> &'static str {
        match self {
            Action::Unlock => "unlock",
            Action::Block => "block",
            Action::Unblock => "unblock",
        }
    }

    /// What it did to the key: "unlocked".
    pub(super) fn done(self) -> &'static str {
        match self {
            Action::Unlock => "unlocked",
            Action::Block => "blocked",
            Action::Unblock => "unblocked",
        }
    }
}

/// How far ahead of this replica's clock another replica's may run: a
/// token issued later than that is none.
const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// The key of the tokens: an HMAC-SHA256 of the time a page was rendered,
/// the action, the limit's name and the key, which only a page this router
/// rendered carries; the clock; and the page's origin, when configured.
pub(super) struct Guard {
    mac: Hmac<Sha256>,
    clock: Option<ManualClock>,
    origin: Option<String>,
}

/// Why an action was refused: said on the 403 page.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `Sec-Fetch-Site` was sent and is not `same-origin`.
    FetchSite,
    /// `Origin` was sent and names another origin (scheme, host, port), or
    /// none (`null`).
    Origin,
    /// The token is missing, malformed, or not this router's for this
    /// action on this key.
    Token,
    /// The token is this router's for this action on this key, from a page
    /// rendered longer
    /// than [`TOKEN_LIFETIME`] ago.
    Expired,
}

impl Refusal {
    /// What the 403 page of a refused `action` says.
    pub(super) fn explain(&self, action: Action) -> String {
        let done = action.done();
        match self {
            Refusal::FetchSite => format!(
                "The browser says this request came from another site \
                 (Sec-Fetch-Site is not same-origin). Nothing was {done}."
            ),
            Refusal::Origin => format!(
                "The request's Origin (its scheme, host and port) is not this \
                 site's. Nothing was {done}."
            ),
            Refusal::Token => format!(
                "The form's token is missing or not valid for this key and this \
                 button (a page of another server, or of an earlier start of this \
                 one?). Nothing was {done}: reload the limit's page and try again."
            ),
            Refusal::Expired => format!(
                "This page has expired: its buttons work for {} after it is \
                 loaded. Nothing was {done}: reload the limit's page and try again.",
                span(TOKEN_LIFETIME)
            ),
        }
    }
}

impl Guard {
    /// A guard whose key is `secret`.
    pub(super) fn new(secret: &[u8]) -> Guard {
        Guard {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"),
            clock: None,
            origin: None,
        }
    }

    /// The guard with its clock pinned to `clock` (the system's if none).
    pub(super) fn with_clock(self, clock: Option<ManualClock>) -> Guard {
        Guard { clock, ..self }
    }

    /// The guard with `origin` ([`serialized_origin`]'s) as the page's own.
    pub(super) fn with_origin(self, origin: Option<String>) -> Guard {
        Guard { origin, ..self }
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

    /// The time now, in whole seconds since the Unix epoch.
    fn now(&self) -> u64 {
        let now = self
            .clock
            .as_ref()
            .map_or_else(SystemTime::now, ManualClock::now);
        now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
    }

    /// The MAC of `action` on `key` under the limit `limit` with a token
    /// issued at `issued`: fixed-width fields, and each name's length
    /// before it, so that no action, name and key run into another.
    fn mac(&self, issued: u64, action: Action, limit: &str, key: &str) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(b"platformkit-limit admin 3\0");
        mac.update(&issued.to_be_bytes());
        let action = action.name();
        mac.update(&(action.len() as u64).to_be_bytes());
        mac.update(action.as_bytes());
        mac.update(&(limit.len() as u64).to_be_bytes());
        mac.update(limit.as_bytes());
        mac.update(key.as_bytes());
        mac
    }

    /// The token a page embeds to do `action` to `key` under `limit`: the
    /// time now (seconds since the Unix epoch), `.`, and the MAC's 64 hex
    /// digits.
    pub(super) fn token(&self, action: Action, limit: &str, key: &str) -> String {
        let issued = self.now();
        let mut token = format!("{issued}.");
        for byte in self.mac(issued, action, limit, key).finalize().into_bytes() {
            let _ = write!(token, "{byte:02x}");
        }
        token
    }

    /// Whether `token` is this guard's for `action` on `key` under `limit`
    /// (its MAC compared in constant time), issued no longer than
    /// [`TOKEN_LIFETIME`] ago.
    fn verify(&self, action: Action, limit: &str, key: &str, token: &str) -> Result<(), Refusal> {
        let (issued, hex) = token.split_once('.').ok_or(Refusal::Token)?;
        let issued = issued.parse::<u64>().map_err(|_| Refusal::Token)?;
        let mac = unhex(hex).ok_or(Refusal::Token)?;
        self.mac(issued, action, limit, key)
            .verify_slice(&mac)
            .map_err(|_| Refusal::Token)?;
        let now = self.now();
        if issued > now.saturating_add(CLOCK_SKEW.as_secs()) {
            Err(Refusal::Token)
        } else if now.saturating_sub(issued) > TOKEN_LIFETIME.as_secs() {
            Err(Refusal::Expired)
        } else {
            Ok(())
        }
    }

    /// Whether `origin` is the page's own: the configured origin; else the
    /// request's host, under the request's scheme when its URI is absolute
    /// and `http` or `https` when it does not say (`Forwarded` and
    /// `X-Forwarded-Proto` are anyone's to send, so never read).
    fn is_own(&self, origin: &str, headers: &HeaderMap, uri: &Uri) -> bool {
        if let Some(own) = &self.origin {
            return origin.eq_ignore_ascii_case(own);
        }
        let host = uri
            .authority()
            .map(|a| a.as_str())
            .or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()));
        let (Some((scheme, origin_host)), Some(host)) = (origin.split_once("://"), host) else {
            return false;
        };
        let scheme_is_own = match uri.scheme_str() {
            Some(own) => scheme.eq_ignore_ascii_case(own),
            None => scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("http"),
        };
        scheme_is_own && origin_host.eq_ignore_ascii_case(host)
    }

    /// Every check of `action` on `key` under `limit` with `token`, given
    /// the request's header fields and its URI (absolute under HTTP/2,
    /// which has no `Host`).
    pub(super) fn check(
        &self,
        headers: &HeaderMap,
        uri: &Uri,
        action: Action,
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
            let origin = origin.to_str().unwrap_or_default();
            if !self.is_own(origin, headers, uri) {
                return Err(Refusal::Origin);
            }
        }
        self.verify(action, limit, key, token.ok_or(Refusal::Token)?)
    }
}

/// The origin `text` names as a browser sends it in `Origin`:
/// `scheme://host[:port]`, lowercase, without the scheme's default port.
///
/// # Errors
///
/// [`Error::invalid_option`] unless `text` is `http://` or `https://` and a
/// host (and port), with no user, path or query.
pub(super) fn serialized_origin(text: &str) -> Result<String, Error> {
    let invalid = || {
        Error::invalid_option(
            "origin",
            format!("{text:?} is no origin: https://host or https://host:port"),
        )
    };
    let uri: Uri = text.parse().map_err(|_| invalid())?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(invalid());
    };
    let default_port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return Err(invalid()),
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() || authority.as_str().contains('@')
    {
        return Err(invalid());
    }
    let host = authority.host().to_ascii_lowercase();
    Ok(match authority.port_u16() {
        Some(port) if port != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
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

    /// A token unlocks its own key under its own limit (or under every
    /// limit), with its own secret, and nothing else; a name and a key
    /// cannot run together, nor a time and a name.
    #[test]
    fn a_token_is_for_one_limit_one_key_one_secret() {
        let guard = Guard::new(&[7; 32]);
        let (login, alice) = ("login", "email|alice@example.com");
        let token = guard.token(Action::Unlock, login, alice);
        let (issued, mac) = token.split_once('.').unwrap();
        assert!(issued.parse::<u64>().is_ok() && mac.len() == 64, "{token}");
        let verify = |limit, key, token: &str| guard.verify(Action::Unlock, limit, key, token);
        assert_eq!(verify(login, alice, &token), Ok(()));
        assert_eq!(
            verify(login, alice, &format!("{issued}.{}", mac.to_uppercase())),
            Ok(())
        );
        let another_time = format!("{}.{mac}", issued.parse::<u64>().unwrap() - 1);
        for (limit, key, token) in [
            (login, "email|bob@example.com", token.as_str()),
            ("login2", alice, &token),
            ("logi", "nemail|alice@example.com", &token),
            (login, alice, &token[..token.len() - 2]),
            (login, alice, &another_time),
            (login, alice, mac),
            (login, alice, "zz"),
            (login, alice, ""),
        ] {
            assert_eq!(
                verify(limit, key, token),
                Err(Refusal::Token),
                "{limit} {key} {token}"
            );
        }
        assert_eq!(
            Guard::new(&[8; 32]).verify(Action::Unlock, login, alice, &token),
            Err(Refusal::Token)
        );
        let everywhere = guard.token(Action::Unlock, EVERY_LIMIT, alice);
        assert_eq!(verify(EVERY_LIMIT, alice, &everywhere), Ok(()));
        assert_eq!(verify(login, alice, &everywhere), Err(Refusal::Token));
        assert_eq!(verify(EVERY_LIMIT, alice, &token), Err(Refusal::Token));
        assert_ne!(
            Guard::random()
                .unwrap()
                .token(Action::Unlock, "login", "id|a"),
            Guard::random()
                .unwrap()
                .token(Action::Unlock, "login", "id|a")
        );
    }

    /// A token acts only as its own form's: a block token neither unlocks
    /// nor unblocks, an unlock token neither blocks nor unblocks, an
    /// unblock token neither blocks nor unlocks, for the same limit and key.
    #[test]
    fn a_token_is_for_one_action() {
        let guard = Guard::new(&[7; 32]);
        let (login, alice) = ("login", "email|alice@example.com");
        let actions = [Action::Unlock, Action::Block, Action::Unblock];
        for issued_for in actions {
            let token = guard.token(issued_for, login, alice);
            for used_as in actions {
                let expected = if used_as == issued_for {
                    Ok(())
                } else {
                    Err(Refusal::Token)
                };
                assert_eq!(
                    guard.verify(used_as, login, alice, &token),
                    expected,
                    "{issued_for:?} as {used_as:?}"
                );
            }
        }
        assert!(
            Refusal::Token
                .explain(Action::Block)
                .contains("Nothing was blocked")
        );
    }

    /// A token unlocks for [`TOKEN_LIFETIME`] after it is issued, then says
    /// it expired; one issued further ahead than another replica's clock
    /// may run is none.
    #[test]
    fn a_token_expires_after_its_lifetime() {
        let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        let guard = Guard::new(&[7; 32]).with_clock(Some(clock.clone()));
        let token = guard.token(Action::Unlock, "login", "id|a");
        clock.advance(TOKEN_LIFETIME);
        assert_eq!(
            guard.verify(Action::Unlock, "login", "id|a", &token),
            Ok(())
        );
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            guard.verify(Action::Unlock, "login", "id|a", &token),
            Err(Refusal::Expired)
        );
        assert!(Refusal::Expired.explain(Action::Unlock).contains("15 min"));

        clock.advance(CLOCK_SKEW + TOKEN_LIFETIME + Duration::from_secs(2));
        let ahead = guard.token(Action::Unlock, "login", "id|a");
        clock.set(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        assert_eq!(
            guard.verify(Action::Unlock, "login", "id|a", &ahead),
            Err(Refusal::Token)
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
        let token = guard.token(Action::Unlock, "login", "id|a");
        let check = |fields: &[(&'static str, &str)], uri: &str| {
            let uri: Uri = uri.parse().unwrap();
            guard.check(
                &headers(fields),
                &uri,
                Action::Unlock,
                "login",
                "id|a",
                Some(&token),
            )
        };
        let (host, path) = (("host", "staff.example:8080"), "/login/unlock");
        assert_eq!(check(&[host], path), Ok(()));
        assert_eq!(
            check(&[host, ("sec-fetch-site", "same-origin")], path),
            Ok(())
        );
        for site in ["cross-site", "same-site", "none", ""] {
            assert_eq!(
                check(&[host, ("sec-fetch-site", site)], path),
                Err(Refusal::FetchSite),
                "{site:?}"
            );
        }
        for origin in [
            "https://staff.example:8080",
            "https://STAFF.example:8080",
            "http://staff.example:8080",
        ] {
            assert_eq!(check(&[host, ("origin", origin)], path), Ok(()), "{origin}");
        }
        assert_eq!(
            check(
                &[("origin", "https://staff.example")],
                "https://staff.example/login/unlock"
            ),
            Ok(())
        );
        for origin in [
            "https://evil.example",
            "https://staff.example",
            "https://staff.example:8080.evil.example",
            "ftp://staff.example:8080",
            "null",
            "",
        ] {
            assert_eq!(
                check(&[host, ("origin", origin)], path),
                Err(Refusal::Origin),
                "{origin:?}"
            );
        }
        assert_eq!(
            check(&[("origin", "https://staff.example")], path),
            Err(Refusal::Origin)
        );
        let uri: Uri = path.parse().unwrap();
        assert_eq!(
            guard.check(
                &headers(&[host]),
                &uri,
                Action::Unlock,
                "login",
                "id|a",
                None
            ),
            Err(Refusal::Token)
        );
        assert_eq!(
            guard.check(
                &headers(&[host]),
                &uri,
                Action::Unlock,
                "login",
                "id|b",
                Some(&token)
            ),
            Err(Refusal::Token)
        );
    }

    /// `Origin` must name the page's scheme too: the configured origin's,
    /// else the request's when its URI is absolute; a header that says
    /// otherwise (`X-Forwarded-Proto`) is not read.
    #[test]
    fn an_origin_of_another_scheme_is_not_the_pages() {
        let plain = Guard::new(&[7; 32]);
        let configured = Guard::new(&[7; 32]).with_origin(Some(
            serialized_origin("HTTPS://Staff.Example:443/").unwrap(),
        ));
        let forwarded = ("x-forwarded-proto", "http");
        let cases: &[(&Guard, &str, &str, bool)] = &[
            (
                &plain,
                "https://staff.example/x",
                "https://staff.example",
                true,
            ),
            (
                &plain,
                "https://staff.example/x",
                "http://staff.example",
                false,
            ),
            (
                &plain,
                "http://staff.example/x",
                "https://staff.example",
                false,
            ),
            (&configured, "/x", "https://staff.example", true),
            (&configured, "/x", "https://STAFF.example", true),
            (&configured, "/x", "http://staff.example", false),
            (&configured, "/x", "https://staff.example:8443", false),
            (
                &configured,
                "http://staff.example/x",
                "https://staff.example",
                true,
            ),
        ];
        for (guard, uri, origin, own) in cases {
            let token = guard.token(Action::Unlock, "login", "id|a");
            let fields = headers(&[("host", "staff.example"), ("origin", origin), forwarded]);
            let checked = guard.check(
                &fields,
                &uri.parse().unwrap(),
                Action::Unlock,
                "login",
                "id|a",
                Some(&token),
            );
            let expected = if *own { Ok(()) } else { Err(Refusal::Origin) };
            assert_eq!(checked, expected, "{uri} {origin}");
        }
        assert_eq!(
            serialized_origin("http://staff.example:8080").unwrap(),
            "http://staff.example:8080"
        );
        for text in [
            "staff.example",
            "ftp://staff.example",
            "https://staff.example/support",
            "https://staff.example/?a",
            "https://user@staff.example",
            "",
        ] {
            assert!(serialized_origin(text).is_err(), "{text:?}");
        }
    }
}
