//! [`Limit`]: a named policy.

use std::sync::Arc;
use std::time::Duration;

use crate::Error;

mod builder;

pub use self::builder::LimitBuilder;

/// A named policy: at most `max` attempts per key in each window of `window`.
///
/// Fixed windows by default, or a sliding estimate ([`Strategy`], [windows](crate::guide#windows)).
/// The name namespaces keys and labels the metrics. Nonsense is refused when the limit is made
/// ([`LimitBuilder::build`]), never at call time:
///
/// ```
/// use platformkit_limit::Limit;
/// use std::time::Duration;
///
/// let login = Limit::new("login", 10, Duration::from_secs(15 * 60))?;
/// assert_eq!(login.name(), "login");
/// assert_eq!(login.max(), 10);
/// assert_eq!(login.window(), Duration::from_secs(900));
///
/// assert!(Limit::new("", 10, Duration::from_secs(60)).is_err());
/// assert!(Limit::new("login", 0, Duration::from_secs(60)).is_err());
/// assert!(Limit::new("login", 10, Duration::ZERO).is_err());
/// assert!(Limit::new("login", 10, Duration::from_millis(1500)).is_err());
/// # Ok::<(), platformkit_limit::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Limit {
    name: Arc<str>,
    max: u32,
    /// The max as built, which tiers keep and the limiter records. Not compared.
    defined_max: u32,
    window_secs: u64,
    when_unreachable: WhenUnreachable,
    on_success: OnSuccess,
    strategy: Strategy,
    lockout_secs: u64,
}

/// How a limit counts over time ([windows](crate::guide#windows)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strategy {
    /// Fixed windows, aligned to the Unix epoch: up to 2 × max across an edge.
    #[default]
    Fixed,
    /// An estimate over the current window and the one before, weighted.
    Sliding,
}

/// What a limit does when the store cannot be reached within the budget
/// ([fail-open](crate::guide#fail-open)).
///
/// | choice | the attempt | the risk |
/// |---|---|---|
/// | `Allow` (default) | allowed, not counted | whoever can make the database unreachable gets unlimited attempts while it lasts |
/// | `Refuse` | refused, with no `retry_after` (answer 503) | whoever can make the database unreachable locks everyone out of the route (fail-closed) |
/// | `CountLocally` | decided by a bounded count in this process ([the local count](crate::guide#down-or-overloaded)); a key it has no room for is refused | N replicas allow up to N × max while it lasts; counts made meanwhile are not in the database afterwards; past the bound, new keys are locked out until old ones' windows close |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenUnreachable {
    /// Allow the attempt without a count: fail-open.
    #[default]
    Allow,
    /// Refuse the attempt: fail-closed.
    Refuse,
    /// Count in this process until the database is back, holding each replica to the limit.
    CountLocally,
}

/// What reporting success on a [`Permit`](crate::Permit) does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnSuccess {
    /// Take the reserved attempt back: a success costs nothing.
    #[default]
    TakeBack,
    /// Clear the key: a success forgives earlier failures.
    Reset,
}

impl Limit {
    /// The longest a limit's name may be, in bytes.
    pub const MAX_NAME_BYTES: usize = 48;

    /// The shortest window a limit may have.
    pub const MIN_WINDOW: Duration = Duration::from_secs(1);

    /// The longest window a limit may have: 366 days.
    pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 60 * 60);

    /// The most attempts a limit may allow in one window.
    pub const MAX_ATTEMPTS: u32 = 1_000_000_000;

    /// The longest lockout a limit may have: a day, as long as `purge` keeps the row it reads.
    pub const MAX_LOCKOUT: Duration = Duration::from_secs(24 * 60 * 60);

    /// A limit named `name` that allows `max` attempts per key in each `window`, with the
    /// default settings: `Limit::builder(name, max, window).build()`.
    ///
    /// # Errors
    ///
    /// As [`LimitBuilder::build`].
    pub fn new(name: &str, max: u32, window: Duration) -> Result<Self, Error> {
        Limit::builder(name, max, window).build()
    }

    /// A builder for a limit as [`Limit::new`]'s, with settings of your own.
    ///
    /// ```
    /// use platformkit_limit::{Limit, Strategy, WhenUnreachable};
    /// use std::time::Duration;
    ///
    /// let login = Limit::builder("login", 5, Duration::from_secs(15 * 60))
    ///     .strategy(Strategy::Sliding)
    ///     .lockout(Duration::from_secs(60 * 60))
    ///     .when_unreachable(WhenUnreachable::Refuse)
    ///     .build()?;
    /// assert_eq!(login.lockout(), Some(Duration::from_secs(3600)));
    /// assert_eq!(login.strategy(), Strategy::Sliding);
    /// assert_eq!(login.when_unreachable(), WhenUnreachable::Refuse);
    /// # Ok::<(), platformkit_limit::Error>(())
    /// ```
    pub fn builder(name: &str, max: u32, window: Duration) -> LimitBuilder {
        LimitBuilder {
            name: name.to_owned(),
            max,
            window,
            lockout: None,
            strategy: Strategy::default(),
            when_unreachable: WhenUnreachable::default(),
            on_success: OnSuccess::default(),
        }
    }

    /// The same limit with another `max`, every other setting kept: a
    /// [tier](crate::guide#api-quotas), sharing one count per key. Calls and lockouts go by the
    /// max of the limit they are given: ask under the tier the key is on.
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, Memory};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let free = Limit::new("api", 100, Duration::from_secs(3600))?;
    /// let paid = free.with_max(1000)?;
    /// assert_eq!((paid.name(), paid.window()), (free.name(), free.window()));
    ///
    /// let client = Key::opaque("client-9");
    /// let batch = NonZeroU32::new(50).unwrap();
    /// limiter.hit(&free, &client).cost(batch).await?;
    /// limiter.hit(&free, &client).cost(batch).await?;
    /// // At 100 and on the free tier: refused (and counted, as every hit).
    /// let verdict = limiter.hit(&free, &client).cost(batch).await?;
    /// assert!(verdict.is_refused());
    /// assert_eq!(verdict.count(), Some(150));
    /// // Upgraded: the same count, under the paid tier's max.
    /// let verdict = limiter.hit(&paid, &client).await?;
    /// assert!(verdict.is_allowed());
    /// assert_eq!((verdict.count(), verdict.remaining()), (Some(151), Some(849)));
    ///
    /// assert!(free.with_max(0).is_err());
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidLimit`](crate::ErrorKind::InvalidLimit) when `max` is 0 or above
    /// [`Limit::MAX_ATTEMPTS`].
    pub fn with_max(&self, max: u32) -> Result<Limit, Error> {
        let mut builder = Limit::builder(self.name(), max, self.window())
            .strategy(self.strategy)
            .when_unreachable(self.when_unreachable)
            .on_success(self.on_success);
        if let Some(lockout) = self.lockout() {
            builder = builder.lockout(lockout);
        }
        let tier = builder.build()?;
        Ok(Limit {
            defined_max: self.defined_max,
            ..tier
        })
    }

    /// What the limiter records of the limit ([`Limiter::limits`](crate::Limiter::limits)): its
    /// max as built, before any [`with_max`](Limit::with_max); the other settings the defaults.
    pub(crate) fn defined(&self) -> Limit {
        Limit {
            max: self.defined_max,
            when_unreachable: WhenUnreachable::default(),
            on_success: OnSuccess::default(),
            ..self.clone()
        }
    }

    /// The lockout, if the limit has one ([`LimitBuilder::lockout`]).
    pub fn lockout(&self) -> Option<Duration> {
        (self.lockout_secs > 0).then(|| Duration::from_secs(self.lockout_secs))
    }

    pub(crate) fn lockout_secs(&self) -> u64 {
        self.lockout_secs
    }

    /// How the limit counts over time ([`LimitBuilder::strategy`]).
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// What the limit does when the store cannot be reached ([`LimitBuilder::when_unreachable`]).
    pub fn when_unreachable(&self) -> WhenUnreachable {
        self.when_unreachable
    }

    /// What reporting success on a permit does ([`LimitBuilder::on_success`]).
    pub fn on_success(&self) -> OnSuccess {
        self.on_success
    }

    /// The limit's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The most attempts allowed per key in one window.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The length of one window.
    pub fn window(&self) -> Duration {
        Duration::from_secs(self.window_secs)
    }

    pub(crate) fn window_secs(&self) -> u64 {
        self.window_secs
    }

    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// Whether `tier` is this limit under some max ([`with_max`](Limit::with_max)): the same in
    /// every other setting, so that both count in one row per key.
    pub fn is_tier(&self, tier: &Limit) -> bool {
        Limit {
            max: tier.max,
            ..self.clone()
        } == *tier
    }

    /// Whether one statement for a key counts and reads alike under this limit and `other`: the
    /// same, or tiers without a lockout (which reads the max).
    pub(crate) fn counts_alike(&self, other: &Limit) -> bool {
        self == other || (self.lockout_secs == 0 && self.is_tier(other))
    }
}

impl PartialEq for Limit {
    /// Every setting but `defined_max`, named so a new one is not missed.
    fn eq(&self, other: &Limit) -> bool {
        let Limit {
            name,
            max,
            defined_max: _,
            window_secs,
            when_unreachable,
            on_success,
            strategy,
            lockout_secs,
        } = self;
        (
            name,
            max,
            window_secs,
            when_unreachable,
            on_success,
            strategy,
            lockout_secs,
        ) == (
            &other.name,
            &other.max,
            &other.window_secs,
            &other.when_unreachable,
            &other.on_success,
            &other.strategy,
            &other.lockout_secs,
        )
    }
}

impl Eq for Limit {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_max_keeps_every_setting_but_max() {
        let builder = |max| {
            Limit::builder("login", max, Duration::from_secs(900))
                .strategy(Strategy::Sliding)
                .lockout(Duration::from_secs(3600))
                .when_unreachable(WhenUnreachable::CountLocally)
                .on_success(OnSuccess::Reset)
        };
        let free = builder(5).build().unwrap();
        let paid = free.with_max(50).unwrap();
        assert_eq!(paid, builder(50).build().unwrap());
        assert_eq!(paid.with_max(5).unwrap(), free);
    }

    #[test]
    fn with_max_validates_max_as_new_does() {
        let limit = Limit::new("api", 100, Duration::from_secs(60)).unwrap();
        for max in [0, Limit::MAX_ATTEMPTS + 1] {
            let err = limit.with_max(max).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidLimit, "{max}");
        }
        assert_eq!(
            limit.with_max(Limit::MAX_ATTEMPTS).unwrap().max(),
            Limit::MAX_ATTEMPTS
        );
    }
}
