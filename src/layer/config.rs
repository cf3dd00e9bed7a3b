//! What a [`LimitLayer`](super::LimitLayer) and its services share: the
//! limiter, the mode, the rules (a limit and whose key), and the answer to
//! a rejection.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use snafu::OptionExt;

use super::client_ip::client_ip;
use crate::error::InvalidOptionSnafu;
use crate::{Error, Key, Limit, Limiter};

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
    Head(KeyFn),
    ClientIp,
}

impl<S, R> Config<S, R> {
    /// Each rule's key for this request, with the rule's index; the rules
    /// that exempt it are left out.
    pub(super) fn keys(&self, head: &Parts) -> Result<Vec<(usize, Key)>, Error> {
        let mut keys = Vec::with_capacity(self.rules.len());
        for (index, rule) in self.rules.iter().enumerate() {
            let key = match &rule.key {
                KeyOf::Head(key) => key(head),
                KeyOf::ClientIp => Some(Key::ip(client_ip(head).context(InvalidOptionSnafu {
                    option: "client address",
                    reason: "the layer limits per client address and the request carries none: \
                             set a ClientIp extension before the layer, or (with the axum \
                             feature) serve with into_make_service_with_connect_info::<SocketAddr>()",
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
