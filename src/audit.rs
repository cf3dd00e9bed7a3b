//! [`AuditEntry`]: what support staff did to a key, who and why.

use std::time::SystemTime;

/// What an operator's call did ([`Limiter::audit`](crate::Limiter::audit)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuditAction {
    /// [`Limiter::block`](crate::Limiter::block).
    Block,
    /// [`Limiter::unblock`](crate::Limiter::unblock).
    Unblock,
    /// [`Limiter::unlock`](crate::Limiter::unlock).
    Unlock,
}

impl AuditAction {
    /// Its name, as the audit stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::Block => "block",
            AuditAction::Unblock => "unblock",
            AuditAction::Unlock => "unlock",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<AuditAction> {
        [
            AuditAction::Block,
            AuditAction::Unblock,
            AuditAction::Unlock,
        ]
        .into_iter()
        .find(|action| action.as_str() == name)
    }
}

/// One entry of the audit, written in the transaction of the action it
/// records. Keys are personal data, and `Debug` shows them: log with care.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    pub(crate) at: SystemTime,
    pub(crate) by: String,
    pub(crate) action: AuditAction,
    /// The stored key: the limit's name, `|`, the encoded key.
    pub(crate) stored: String,
    pub(crate) until: Option<SystemTime>,
    pub(crate) windows: Option<u64>,
    pub(crate) reason: String,
}

impl AuditEntry {
    /// When, on the store's clock.
    pub fn at(&self) -> SystemTime {
        self.at
    }

    /// Who, as the operator's call named them.
    pub fn by(&self) -> &str {
        &self.by
    }

    /// What.
    pub fn action(&self) -> AuditAction {
        self.action
    }

    /// The limit's name.
    pub fn limit(&self) -> &str {
        self.stored.split_once('|').map_or("", |(limit, _)| limit)
    }

    /// The encoded key, as [`KeyStatus::key`](crate::KeyStatus::key) gives it.
    pub fn key(&self) -> &str {
        self.stored
            .split_once('|')
            .map_or(&*self.stored, |(_, key)| key)
    }

    /// A block's end.
    pub fn until(&self) -> Option<SystemTime> {
        self.until
    }

    /// How many rows an unblock or an unlock deleted.
    pub fn windows(&self) -> Option<u64> {
        self.windows
    }

    /// Why, as the operator's call said.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}
