//! [`KeyStatus`], and the operator's calls that answer it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use snafu::ensure;

use crate::decide::{Counted, Counting, decision};
use crate::error::{InvalidLimitSnafu, InvalidOptionSnafu, UnexpectedSnafu};
use crate::key::stored;
use crate::limiter::run::Call;
use crate::metric::Operation;
use crate::store::sealed::Sealed as _;
use crate::store::{Asked, Store, count_pairs};
use crate::{AuditAction, AuditEntry, Error, Key, Limit, Limiter};

/// A key's state under a limit, read without counting ([`Limiter::status`],
/// [`Limiter::refused_keys`]); decided as a [`check`](Limiter::check) is, so
/// the two agree.
///
/// ```
/// use platformkit_limit::{Key, Limit, Limiter, Memory};
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(Memory::new());
/// let login = Limit::new("login", 2, Duration::from_secs(60))?;
/// let alice = Key::email("Alice@example.com");
/// limiter.failed(&login, &alice).await?;
/// limiter.failed(&login, &alice).await?;
///
/// let status = limiter.status(&login, &alice).await?;
/// assert_eq!(status.key(), "email|alice@example.com");
/// assert_eq!((status.count(), status.max()), (2, 2));
/// assert!(status.is_refused());
/// assert!(status.retry_after().is_some());
///
/// limiter.reset(&login, &alice).await?;
/// assert!(!limiter.status(&login, &alice).await?.is_refused());
/// # Ok::<(), platformkit_limit::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyStatus {
    limit: Arc<str>,
    key: Box<str>,
    count: u64,
    max: u32,
    refused: bool,
    window_end: SystemTime,
    reopens_at: SystemTime,
    locked_until: Option<SystemTime>,
    now: SystemTime,
}

impl KeyStatus {
    /// The status of stored key `stored` under `limit`, as a `check`.
    pub(crate) fn decided(limit: &Limit, stored: &str, counted: &Counted) -> KeyStatus {
        let decided = decision(Counting::CHECK, limit, 1, counted);
        let key = stored
            .strip_prefix(limit.name())
            .and_then(|rest| rest.strip_prefix('|'))
            .unwrap_or(stored);
        KeyStatus {
            limit: limit.name_arc().clone(),
            key: key.into(),
            count: decided.estimate,
            max: limit.max(),
            refused: !decided.allowed,
            window_end: counted.window_end,
            reopens_at: decided.reopens_at,
            locked_until: decided.locked_until,
            now: counted.now,
        }
    }

    /// The limit's name.
    pub fn limit(&self) -> &str {
        &self.limit
    }

    /// The encoded key, as [`Key::as_str`] gives it (a long key in its
    /// digest form). Keys are personal data, and `Debug` shows this field:
    /// log with care.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// What [`Verdict::count`](crate::Verdict::count) of a `check` says.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The limit's max.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Whether the limit refuses the key's next attempt now: the count (or
    /// estimate) is at max, or a lockout is running.
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// When the current window closes.
    pub fn window_end(&self) -> SystemTime {
        self.window_end
    }

    /// For a refused key, the first moment its next attempt may go ahead;
    /// `None` when it is not refused.
    pub fn reopens_at(&self) -> Option<SystemTime> {
        self.refused.then_some(self.reopens_at)
    }

    /// For a refused key, how long until [`reopens_at`](KeyStatus::reopens_at),
    /// on the store's clock; `None` when it is not refused.
    pub fn retry_after(&self) -> Option<Duration> {
        self.reopens_at()
            .map(|at| at.duration_since(self.now).unwrap_or_default())
    }

    /// The end of the lockout running for the key, or of its
    /// [block](Limiter::block), if one is.
    pub fn locked_until(&self) -> Option<SystemTime> {
        self.locked_until
    }

    /// The store's time when the status was read.
    pub fn read_at(&self) -> SystemTime {
        self.now
    }
}

impl<S: Store> Limiter<S> {
    /// The state of `key` under `limit` now: a `check`'s statement, no call
    /// outcome recorded, nothing counted, never from the refusal cache
    /// ([who is locked out](crate::guide#who-is-locked-out)).
    ///
    /// # Errors
    ///
    /// Any failure, unreachable included: a status is never guessed.
    pub async fn status(&self, limit: &Limit, key: &Key) -> Result<KeyStatus, Error> {
        let stored = stored(limit.name(), key);
        let call = Call::start(Operation::Check, self.budget());
        let store = self.store();
        let counted = call
            .within_store(
                store,
                store.count(
                    Counting::CHECK,
                    limit,
                    &stored,
                    0,
                    call.deadline(),
                    &mut Default::default(),
                ),
            )
            .await?;
        Ok(KeyStatus::decided(limit, &stored, &counted))
    }

    /// The keys `limit` (by name) refuses now, at most `at_most`, newest
    /// first: by the latest window counted in, then the highest count, then
    /// the key. Nothing counted; give the limit the service uses, as its
    /// numbers decide ([who is locked out](crate::guide#who-is-locked-out)).
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, Memory};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let login = Limit::new("login", 1, Duration::from_secs(60))?;
    /// limiter.failed(&login, &Key::username("bob")).await?;
    /// let refused = limiter.refused_keys(&login, 10).await?;
    /// assert_eq!(refused.len(), 1);
    /// assert_eq!(refused[0].key(), "user|bob");
    /// assert!(limiter.refused_keys(&login, 0).await.is_err());
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) when
    /// `at_most` is 0 or above [`Limiter::MAX_REFUSED_KEYS`]; any failure
    /// of the store, unreachable included.
    pub async fn refused_keys(
        &self,
        limit: &Limit,
        at_most: usize,
    ) -> Result<Vec<KeyStatus>, Error> {
        ensure!(
            (1..=Limiter::MAX_REFUSED_KEYS).contains(&at_most),
            InvalidOptionSnafu {
                option: "at_most",
                reason: format!("refused_keys lists 1 to {} keys", Limiter::MAX_REFUSED_KEYS),
            }
        );
        let prefix = format!("{}|", limit.name());
        let call = Call::start(Operation::RefusedKeys, self.budget());
        let store = self.store();
        let listed = call
            .within_store(
                store,
                store.refused(limit, &prefix, at_most, call.deadline()),
            )
            .await?;
        Ok(listed
            .iter()
            .map(|(stored, counted)| KeyStatus::decided(limit, stored, counted))
            // The crate's decision has the last word.
            .filter(KeyStatus::is_refused)
            .collect())
    }
}

impl<S: Store> Limiter<S> {
    /// Records `limits` in the store, each replacing what is recorded under
    /// its name, for the operator's tools
    /// ([the limits](crate::guide#the-limits-as-the-service-defines-them)).
    ///
    /// # Errors
    ///
    /// Any failure of the store, unreachable included; the limits before
    /// the one that failed are recorded.
    pub async fn record<'a>(
        &self,
        limits: impl IntoIterator<Item = &'a Limit>,
    ) -> Result<(), Error> {
        for limit in limits {
            let call = Call::start(Operation::Operator, self.budget());
            let store = self.store();
            call.within_store(store, store.define(limit, call.deadline()))
                .await?;
        }
        Ok(())
    }

    /// The limits recorded in the store ([`record`](Limiter::record)), by
    /// name, their settings but those recorded the defaults.
    ///
    /// ```
    /// use platformkit_limit::{Limit, Limiter, Memory};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let login = Limit::new("login", 5, Duration::from_secs(900))?;
    /// let paid = login.with_max(50)?;
    /// limiter.record([&login, &paid]).await?;
    /// assert_eq!(limiter.limits().await?, [login]);
    /// assert!(limiter.limit("logins").await.is_err());
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// Any failure of the store, unreachable included.
    pub async fn limits(&self) -> Result<Vec<Limit>, Error> {
        let call = Call::start(Operation::Operator, self.budget());
        call.within_store(self.store(), self.store().limits(call.deadline()))
            .await
    }

    /// The limit recorded under `name` ([`limits`](Limiter::limits)).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidLimit`](crate::ErrorKind::InvalidLimit), naming
    /// the limits recorded, when none is recorded under `name`; any failure
    /// of the store.
    pub async fn limit(&self, name: &str) -> Result<Limit, Error> {
        let limits = self.limits().await?;
        let names: Vec<&str> = limits.iter().map(Limit::name).collect();
        let reason = format!(
            "no limit of this name is recorded; the limits recorded: {}",
            names.join(", ")
        );
        limits
            .iter()
            .find(|limit| limit.name() == name)
            .cloned()
            .ok_or_else(|| InvalidLimitSnafu { name, reason }.build().into())
    }

    /// `key`'s state under each limit recorded that has a count or a
    /// lockout for it, by limit name, one read per [`Limiter::MAX_PAIRS`]
    /// limits ([the limits](crate::guide#the-limits-as-the-service-defines-them)).
    ///
    /// # Errors
    ///
    /// As [`limits`](Limiter::limits) and [`status`](Limiter::status).
    pub async fn statuses(&self, key: &Key) -> Result<Vec<KeyStatus>, Error> {
        let limits = self.limits().await?;
        let store = self.store();
        let mut statuses = Vec::new();
        for limits in limits.chunks(Limiter::MAX_PAIRS) {
            let keys: Vec<String> = limits.iter().map(|l| stored(l.name(), key)).collect();
            let asked: Vec<Asked<'_>> = limits
                .iter()
                .zip(&keys)
                .map(|(limit, key)| Asked { limit, key, n: 0 })
                .collect();
            let call = Call::start(Operation::Check, self.budget());
            let read = count_pairs(store, Counting::CHECK, &asked, call.deadline());
            let (counted, _) = call.within_store(store, read).await?;
            statuses.extend(
                asked
                    .iter()
                    .zip(&counted)
                    .map(|(pair, counted)| KeyStatus::decided(pair.limit, pair.key, counted))
                    .filter(|status| status.count() > 0 || status.locked_until().is_some()),
            );
        }
        Ok(statuses)
    }

    /// Refuses `key` under `limit` for `block_for` (whole seconds, at most
    /// [`Limiter::MAX_BLOCK`]) whatever its count, replacing a block it had,
    /// audited with `by` and `reason` ([blocks and the audit](crate::guide#blocks-and-the-audit)).
    /// While the store is unreachable the limit's
    /// [`WhenUnreachable`](crate::WhenUnreachable) decides, block or not.
    /// Returns when it ends, on the store's clock (within a second after `block_for`).
    ///
    /// ```
    /// use platformkit_limit::{AuditAction, Key, Limit, Limiter, Memory};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let login = Limit::new("login", 5, Duration::from_secs(900))?;
    /// let mallory = Key::email("mallory@example.com");
    /// limiter.block(&login, &mallory, Duration::from_secs(3600), "ann", "ticket 4121").await?;
    /// assert!(limiter.check(&login, &mallory).await?.is_refused());
    /// limiter.unblock(&login, &mallory, "bob", "cleared by security").await?;
    /// assert!(limiter.check(&login, &mallory).await?.is_allowed());
    /// let audit = limiter.audit(None, 10).await?;
    /// assert_eq!(audit[0].action(), AuditAction::Unblock);
    /// assert_eq!((audit[1].by(), audit[1].reason()), ("ann", "ticket 4121"));
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) for a
    /// length out of bounds, or an empty or too long `by` or `reason`
    /// ([`Limiter::MAX_AUDIT_BYTES`]); any failure of the store.
    pub async fn block(
        &self,
        limit: &Limit,
        key: &Key,
        block_for: Duration,
        by: &str,
        reason: &str,
    ) -> Result<SystemTime, Error> {
        ensure!(
            block_for >= Duration::from_secs(1)
                && block_for <= Limiter::MAX_BLOCK
                && block_for.subsec_nanos() == 0,
            InvalidOptionSnafu {
                option: "block_for",
                reason: "a block lasts whole seconds, 1 s to 30 days",
            }
        );
        let (_, until) = self
            .operated(AuditAction::Block, limit, key, block_for, (by, reason))
            .await?;
        until.ok_or_else(|| {
            UnexpectedSnafu {
                operation: Operation::Operator,
                what: "a block without its end",
            }
            .build()
            .into()
        })
    }

    /// Ends `key`'s block under `limit`, its counts kept, audited; how many
    /// blocks went (0: it had none).
    ///
    /// # Errors
    ///
    /// As [`block`](Limiter::block).
    pub async fn unblock(
        &self,
        limit: &Limit,
        key: &Key,
        by: &str,
        reason: &str,
    ) -> Result<u64, Error> {
        let who = (by, reason);
        Ok(self
            .operated(AuditAction::Unblock, limit, key, Duration::ZERO, who)
            .await?
            .0)
    }

    /// [`reset`](Limiter::reset), audited: an operator's unlock of `key`
    /// under `limit`, every window and block of it deleted; how many went.
    ///
    /// # Errors
    ///
    /// As [`block`](Limiter::block).
    pub async fn unlock(
        &self,
        limit: &Limit,
        key: &Key,
        by: &str,
        reason: &str,
    ) -> Result<u64, Error> {
        let who = (by, reason);
        Ok(self
            .operated(AuditAction::Unlock, limit, key, Duration::ZERO, who)
            .await?
            .0)
    }

    /// [`unlock`](Limiter::unlock)s `key` under every limit recorded: each
    /// limit and how many of its windows went, for the limits that held any.
    ///
    /// # Errors
    ///
    /// As [`limits`](Limiter::limits) and [`unlock`](Limiter::unlock); a
    /// failure stops at that limit, the ones before it unlocked.
    pub async fn unlock_everywhere(
        &self,
        key: &Key,
        by: &str,
        reason: &str,
    ) -> Result<Vec<(Limit, u64)>, Error> {
        let mut cleared = Vec::new();
        for limit in self.limits().await? {
            let windows = self.unlock(&limit, key, by, reason).await?;
            if windows > 0 {
                cleared.push((limit, windows));
            }
        }
        Ok(cleared)
    }

    /// The audit, newest first, at most `at_most` entries (1 to
    /// [`Limiter::MAX_REFUSED_KEYS`]), of `limit`'s keys or of every key.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) for
    /// `at_most` out of bounds; any failure of the store.
    pub async fn audit(
        &self,
        limit: Option<&Limit>,
        at_most: usize,
    ) -> Result<Vec<AuditEntry>, Error> {
        ensure!(
            (1..=Limiter::MAX_REFUSED_KEYS).contains(&at_most),
            InvalidOptionSnafu {
                option: "at_most",
                reason: format!("the audit lists 1 to {} entries", Limiter::MAX_REFUSED_KEYS),
            }
        );
        let prefix = limit.map_or_else(String::new, |limit| format!("{}|", limit.name()));
        let call = Call::start(Operation::Operator, self.budget());
        let store = self.store();
        call.within_store(store, store.audit(&prefix, at_most, call.deadline()))
            .await
    }

    /// An operator's action on `key` under `limit`, audited.
    async fn operated(
        &self,
        action: AuditAction,
        limit: &Limit,
        key: &Key,
        block_for: Duration,
        (by, reason): (&str, &str),
    ) -> Result<(u64, Option<SystemTime>), Error> {
        let (most_by, most_reason) = Limiter::MAX_AUDIT_BYTES;
        let fits =
            |text: &str, most: usize| (1..=most).contains(&text.len()) && !text.contains('\0');
        ensure!(
            fits(by, most_by) && fits(reason, most_reason),
            InvalidOptionSnafu {
                option: "by, reason",
                reason: format!(
                    "an operator's call says who (1 to {most_by} bytes) and why (1 to {most_reason} bytes), with no NUL"
                ),
            }
        );
        let stored = stored(limit.name(), key);
        let call = Call::start(Operation::Operator, self.budget());
        self.refusals.forget(&stored);
        let store = self.store();
        let done = store.operate(action, &stored, block_for, (by, reason), call.deadline());
        let result = call.within_store(store, done).await;
        if action == AuditAction::Unlock && result.is_ok() {
            // The local count (if the limit ever fell back to it) too.
            let _ = self.fallback.reset(&stored, call.deadline()).await;
        }
        // Again: a refusal cached by a call that raced it is stale.
        self.refusals.forget(&stored);
        result
    }
}
