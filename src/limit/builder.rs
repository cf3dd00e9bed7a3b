//! [`LimitBuilder`]: a [`Limit`]'s options, checked in [`LimitBuilder::build`].

use std::sync::Arc;
use std::time::Duration;

use snafu::ensure;

use super::{Limit, OnSuccess, Strategy, WhenUnreachable};
use crate::Error;
use crate::error::InvalidLimitSnafu;

/// A [`Limit`]'s settings, from [`Limit::builder`]; [`build`](LimitBuilder::build) checks them.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct LimitBuilder {
    pub(super) name: String,
    pub(super) max: u32,
    pub(super) window: Duration,
    pub(super) lockout: Option<Duration>,
    pub(super) strategy: Strategy,
    pub(super) when_unreachable: WhenUnreachable,
    pub(super) on_success: OnSuccess,
}

impl LimitBuilder {
    /// Keeps a key refused for `lockout` after a window in which its count reached `max`.
    pub fn lockout(mut self, lockout: Duration) -> Self {
        self.lockout = Some(lockout);
        self
    }

    /// How the limit counts over time (by default, [`Strategy::Fixed`]).
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// What the limit does when the store cannot be reached (default [`WhenUnreachable::Allow`]).
    pub fn when_unreachable(mut self, choice: WhenUnreachable) -> Self {
        self.when_unreachable = choice;
        self
    }

    /// What success on a [`Permit`](crate::Permit) does (default [`OnSuccess::TakeBack`]).
    pub fn on_success(mut self, choice: OnSuccess) -> Self {
        self.on_success = choice;
        self
    }

    /// Checks every setting and makes the limit.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidLimit`](crate::ErrorKind::InvalidLimit) when:
    /// - the name is empty, longer than [`Limit::MAX_NAME_BYTES`] or has a character other than
    ///   ASCII letters, digits, `_`, `-` and `.`;
    /// - `max` is 0 or above [`Limit::MAX_ATTEMPTS`];
    /// - the window is not whole seconds from [`Limit::MIN_WINDOW`] to [`Limit::MAX_WINDOW`];
    /// - a lockout is not whole seconds from one to [`Limit::MAX_LOCKOUT`].
    pub fn build(self) -> Result<Limit, Error> {
        let LimitBuilder {
            name,
            max,
            window,
            lockout,
            strategy,
            when_unreachable,
            on_success,
        } = self;
        let invalid = |reason: String| InvalidLimitSnafu {
            name: name.as_str(),
            reason,
        };
        ensure!(!name.is_empty(), invalid("the name is empty".into()));
        ensure!(
            name.len() <= Limit::MAX_NAME_BYTES,
            invalid(format!(
                "the name is longer than {} bytes",
                Limit::MAX_NAME_BYTES
            ))
        );
        ensure!(
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')),
            invalid("the name may hold only ASCII letters, digits, '_', '-' and '.'".into())
        );
        ensure!(max >= 1, invalid("max must be at least 1".into()));
        ensure!(
            max <= Limit::MAX_ATTEMPTS,
            invalid(format!("max must be at most {}", Limit::MAX_ATTEMPTS))
        );
        ensure!(
            window >= Limit::MIN_WINDOW,
            invalid(format!(
                "the window must be at least {} s",
                Limit::MIN_WINDOW.as_secs()
            ))
        );
        ensure!(
            window <= Limit::MAX_WINDOW,
            invalid(format!(
                "the window must be at most {} days",
                Limit::MAX_WINDOW.as_secs() / 86_400
            ))
        );
        ensure!(
            window.subsec_nanos() == 0,
            invalid("the window must be a whole number of seconds".into())
        );
        if let Some(lockout) = lockout {
            ensure!(
                lockout >= Duration::from_secs(1),
                invalid("the lockout must be at least one second".into())
            );
            ensure!(
                lockout <= Limit::MAX_LOCKOUT,
                invalid(format!(
                    "the lockout must be at most {} hours: purge keeps a closed window's row \
                     that long",
                    Limit::MAX_LOCKOUT.as_secs() / 3_600
                ))
            );
            ensure!(
                lockout.subsec_nanos() == 0,
                invalid("the lockout must be a whole number of seconds".into())
            );
        }
        Ok(Limit {
            name: Arc::from(name.as_str()),
            max,
            defined_max: max,
            window_secs: window.as_secs(),
            when_unreachable,
            on_success,
            strategy,
            lockout_secs: lockout.map_or(0, |l| l.as_secs()),
        })
    }
}
