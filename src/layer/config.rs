//! What a [`LimitLayer`](super::LimitLayer) and its services share, and each request's keys.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

use super::client_ip::client_ip;
use super::response::Rejection;
use crate::error::InvalidLimitSnafu;
use crate::{Error, Key, Limit, Limiter};

/// A key function: who a rule counts, read from the request head.
pub(super) type KeyFn = Arc<dyn Fn(&Parts) -> Option<Key> + Send + Sync>;

/// What a request costs, read from its head.
pub(super) type CostFn = Arc<dyn Fn(&Parts) -> u32 + Send + Sync>;

/// The tier a request is counted under, read from its head.
pub(super) type TierFn = Arc<dyn Fn(&Parts) -> Option<Limit> + Send + Sync>;

/// Whether a response says the attempt succeeded.
pub(super) type SucceededFn = Arc<dyn Fn(&http::response::Parts) -> bool + Send + Sync>;

/// What a layer and its services share.
pub(super) struct Config<S, R> {
    pub(super) limiter: Arc<Limiter<S>>,
    pub(super) mode: Mode,
    pub(super) rules: Vec<Rule>,
    /// What a request costs; 1 without it.
    pub(super) cost: Option<CostFn>,
    pub(super) respond: Arc<R>,
}

#[derive(Clone)]
pub(super) enum Mode {
    Hit,
    /// `hit`, counted under every rule only if every rule allows it.
    HitAllOrNothing,
    Attempt(SucceededFn),
}

#[derive(Clone)]
pub(super) struct Rule {
    pub(super) limit: Limit,
    pub(super) key: KeyOf,
    pub(super) advertised: bool,
    /// The tier of each request; the rule's limit without it, or for `None`.
    pub(super) tier: Option<TierFn>,
}

/// One rule's ask for one request: the limit it is counted under is the rule's, or its tier.
pub(super) struct Asked {
    pub(super) rule: usize,
    pub(super) key: Key,
    pub(super) limit: Limit,
}

#[derive(Clone)]
pub(super) enum KeyOf {
    /// A key function; `None` exempts the request from the rule.
    Head(KeyFn),
    /// A key function; `None` is answered 400 ([`Rejection::MissingKey`]).
    Required(KeyFn),
    /// The client's address; none is answered 500 ([`Rejection::NoClientAddress`]).
    ClientIp,
}

impl<S, R> Config<S, R> {
    /// Each rule's ask for this request, exempting rules left out. The first rule that cannot do
    /// without its key and finds none, or whose tier is not its limit, makes the rejection.
    pub(super) fn keys(&self, head: &Parts) -> Result<Vec<Asked>, Rejection> {
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
            let Some(key) = key else {
                continue;
            };
            let limit = match rule.tier.as_ref().and_then(|tier| tier(head)) {
                Some(tier) if rule.limit.is_tier(&tier) => tier,
                Some(tier) => {
                    let error = InvalidLimitSnafu {
                        name: tier.name(),
                        reason: format!(
                            "the tier of a request must be the rule's limit {:?} under another \
                             max (Limit::with_max), the same in every other setting",
                            rule.limit.name()
                        ),
                    }
                    .build();
                    return Err(Rejection::Failed(Error::from(error)));
                }
                None => rule.limit.clone(),
            };
            keys.push(Asked {
                rule: index,
                key,
                limit,
            });
        }
        Ok(keys)
    }

    /// What the request costs: the cost function's, or 1.
    pub(super) fn cost(&self, head: &Parts) -> u32 {
        self.cost.as_ref().map_or(1, |cost| cost(head))
    }
}

impl<S, R> Clone for Config<S, R> {
    fn clone(&self) -> Self {
        Config {
            limiter: self.limiter.clone(),
            mode: self.mode.clone(),
            rules: self.rules.clone(),
            cost: self.cost.clone(),
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
                (rule.limit.name(), key, rule.advertised, rule.tier.is_some())
            })
            .collect();
        let mode = match self.mode {
            Mode::Hit => "hit",
            Mode::HitAllOrNothing => "hit_all_or_nothing",
            Mode::Attempt(_) => "attempt",
        };
        f.debug_struct("LimitLayer")
            .field("mode", &mode)
            .field("rules", &rules)
            .field("costed", &self.cost.is_some())
            .finish_non_exhaustive()
    }
}
