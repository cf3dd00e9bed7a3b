//! What a [`LimitLayer`](super::LimitLayer) and its services share: the
//! limiter, the mode, the rules (a limit and whose key), and the answer to
//! a rejection.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

use super::client_ip::client_ip;
use super::response::Rejection;
use crate::{Key, Limit, Limiter};

/// A key function: who a rule counts, read from the request head.
pub(super) type KeyFn = Arc<dyn Fn(&Parts) -> Option<Key> + Send + Sync>;

/// Whether a response says the attempt succeeded.
pub(super) type SucceededFn = Arc<dyn Fn(&http::response::Parts) -> bool + Send + Sync>;

/// What a layer and its services share.
pub(super) struct Config<S, R> {
    pub(super) limiter: Arc<Limiter<S>>,
    pub(super) mode: Mode,
    pub(super) rules: Vec<Rule>,
    pub(super) respond: Arc<R>,
}

#[derive(Clone)]
pub(super) enum Mode {
    Hit,
    Attempt(SucceededFn),
}

#[derive(Clone)]
pub(super) struct Rule {
    pub(super) limit: Limit,
    pub(super) key: KeyOf,
    pub(super) advertised: bool,
}

#[derive(Clone)]
pub(super) enum KeyOf {
    /// A key function; `None` exempts the request from the rule.
    Head(KeyFn),
    /// A key function; `None` is answered 400 ([`Rejection::MissingKey`]).
    Required(KeyFn),
    /// The client's address; none is answered 500
    /// ([`Rejection::NoClientAddress`]).
    ClientIp,
}

impl<S, R> Config<S, R> {
    /// Each rule's key for this request, with the rule's index; the rules
    /// that exempt it are left out. The first rule, in the order they were
    /// added, that cannot do without its key and finds none makes the
    /// rejection instead.
    pub(super) fn keys(&self, head: &Parts) -> Result<Vec<(usize, Key)>, Rejection> {
        let mut keys = Vec::with_capacity(self.rules.len());
        for (index, rule) in self.rules.iter().enumerate() {
            let key = match &rule.key {
                KeyOf::Head(key) => key(head),
                KeyOf::Required(key) => Some(key(head).ok_or_else(|| Rejection::MissingKey {
                    limit: rule.limit.name().to_owned(),
                })?),
                KeyOf::ClientIp => Some(Key::ip(client_ip(head).ok_or_else(|| {
                    Rejection::NoClientAddress {
                        limit: rule.limit.name().to_owned(),
                    }
                })?)),
            };
            if let Some(key) = key {
                keys.push((index, key));
            }
        }
        Ok(keys)
    }
}

impl<S, R> Clone for Config<S, R> {
    fn clone(&self) -> Self {
        Config {
            limiter: self.limiter.clone(),
            mode: self.mode.clone(),
            rules: self.rules.clone(),
            respond: self.respond.clone(),
        }
    }
}

impl<S, R> fmt::Debug for Config<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<_> = self
            .rules
            .iter()
            .map(|rule| {
                let key = match rule.key {
                    KeyOf::Head(_) => "head",
                    KeyOf::Required(_) => "head, required",
                    KeyOf::ClientIp => "client ip",
                };
                (rule.limit.name(), key, rule.advertised)
            })
            .collect();
        let mode = match self.mode {
            Mode::Hit => "hit",
            Mode::Attempt(_) => "attempt",
        };
        f.debug_struct("LimitLayer")
            .field("mode", &mode)
            .field("rules", &rules)
            .finish_non_exhaustive()
    }
}
