//! The `_all` calls, and `run_all`, the one path of every counting call.

use std::num::NonZeroU32;

use snafu::ensure;

use super::cost::Ask;
use super::permit::CountedIn;
use crate::cache::{Lookup, Refresh};
use crate::call::Call;
use crate::error::InvalidOptionSnafu;
use crate::key::stored;
use crate::metric::{Outcome, Source};
use crate::operation::Counting;
use crate::store::Store;
use crate::{Error, Key, Limit, Limiter, Verdict, Verdicts};

impl<S: Store> Limiter<S> {
    /// As [`check`](Limiter::check), over several (limit, key) pairs in one
    /// statement: a login's per-account and per-address limits at once.
    /// The verdicts come in the order given; [`Verdicts::refused_by`] says
    /// which limit refused.
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, Memory};
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let per_account = Limit::new("login-account", 5, Duration::from_secs(900))?;
    /// let per_address = Limit::new("login-address", 1, Duration::from_secs(900))?;
    /// let account = Key::email("alice@example.com");
    /// let address = Key::ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
    /// let both = [(&per_account, &account), (&per_address, &address)];
    ///
    /// limiter.failed_all(&both).await?;
    /// let verdicts = limiter.check_all(&both).await?;
    /// assert!(verdicts.is_refused());
    /// assert_eq!(verdicts.refused_by().map(|v| v.limit()), Some("login-address"));
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) for no
    /// pairs or more than [`Limiter::MAX_PAIRS`]; otherwise as [`Limiter::check`].
    pub async fn check_all(&self, pairs: &[(&Limit, &Key)]) -> Result<Verdicts, Error> {
        self.counted_all(Counting::CHECK, pairs, NonZeroU32::MIN)
            .await
    }

    /// As [`failed`](Limiter::failed), over several pairs in one statement.
    /// Concurrent calls cannot deadlock, whatever their order.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`].
    pub async fn failed_all(&self, pairs: &[(&Limit, &Key)]) -> Result<Verdicts, Error> {
        self.counted_all(Counting::FAILED, pairs, NonZeroU32::MIN)
            .await
    }

    /// As [`hit`](Limiter::hit), over several pairs in one statement: the
    /// ask is counted under every limit, and goes ahead only if all allow it.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`].
    pub fn hit_all<'l, 'p>(
        &'l self,
        pairs: &'p [(&'p Limit, &'p Key)],
    ) -> Ask<'l, 'p, S, Verdicts> {
        Ask::all(self, Counting::HIT, pairs)
    }

    /// As [`hit_all`](Limiter::hit_all), all or nothing: the cost is counted
    /// under every limit if all allow it, under none if one refuses. For
    /// quotas, where a refusal per second must not spend the day's quota
    /// ([all or nothing](crate::guide#api-quotas)).
    ///
    /// ```
    /// use platformkit_limit::{Key, Limit, Limiter, ManualClock, Memory};
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    /// let limiter = Limiter::new(Memory::new().with_clock(clock.clone()));
    /// let per_second = Limit::new("api-second", 2, Duration::from_secs(1))?;
    /// let per_day = Limit::new("api-day", 5, Duration::from_secs(86_400))?;
    /// let client = Key::opaque("client-9");
    /// let both = [(&per_second, &client), (&per_day, &client)];
    ///
    /// limiter.hit_all_or_nothing(&both).await?;
    /// limiter.hit_all_or_nothing(&both).await?;
    /// let third = limiter.hit_all_or_nothing(&both).await?;
    /// assert_eq!(third.refused_by().map(|v| v.limit()), Some("api-second"));
    /// // The refusal spent none of the day's quota.
    /// assert_eq!(limiter.check(&per_day, &client).await?.count(), Some(2));
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.hit_all_or_nothing(&both).await?.is_allowed());
    /// # Ok::<(), platformkit_limit::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`], and
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) for a
    /// (limit, key) pair given twice.
    pub fn hit_all_or_nothing<'l, 'p>(
        &'l self,
        pairs: &'p [(&'p Limit, &'p Key)],
    ) -> Ask<'l, 'p, S, Verdicts> {
        Ask::all(self, Counting::HIT_ALL_OR_NOTHING, pairs)
    }

    pub(super) async fn counted_all(
        &self,
        op: Counting,
        pairs: &[(&Limit, &Key)],
        cost: NonZeroU32,
    ) -> Result<Verdicts, Error> {
        let counted = self.counted_all_in(op, pairs, cost).await?;
        Ok(Verdicts::from_vec(
            counted.into_iter().map(|(verdict, _)| verdict).collect(),
        ))
    }

    /// Each pair's verdict, and where it was counted.
    pub(crate) async fn counted_all_in(
        &self,
        op: Counting,
        pairs: &[(&Limit, &Key)],
        cost: NonZeroU32,
    ) -> Result<Vec<(Verdict, CountedIn)>, Error> {
        ensure!(
            !pairs.is_empty(),
            InvalidOptionSnafu {
                option: "pairs",
                reason: "give at least one (limit, key) pair: no pairs would allow everything",
            }
        );
        ensure!(
            pairs.len() <= Limiter::MAX_PAIRS,
            InvalidOptionSnafu {
                option: "pairs",
                reason: format!(
                    "at most {} (limit, key) pairs in one call",
                    Limiter::MAX_PAIRS
                ),
            }
        );
        let stored: Vec<(&Limit, String)> = pairs
            .iter()
            .map(|(limit, key)| (*limit, stored(limit.name(), key)))
            .collect();
        ensure!(
            !op.all_or_nothing()
                || stored
                    .iter()
                    .enumerate()
                    .all(|(i, (_, key))| stored[..i].iter().all(|(_, k)| k != key)),
            InvalidOptionSnafu {
                option: "pairs",
                reason: "an all-or-nothing call decides each (limit, key) pair by its own count: give each pair once",
            }
        );
        self.run_all(op, &stored, cost).await
    }

    /// The one path of every counting call, whatever its pairs and cost
    /// ([one call's path](crate::guide#one-calls-path)).
    pub(crate) async fn run_all(
        &self,
        op: Counting,
        stored: &[(&Limit, String)],
        cost: NonZeroU32,
    ) -> Result<Vec<(Verdict, CountedIn)>, Error> {
        // `counted_all_in` checked the number.
        debug_assert!(
            (1..=Limiter::MAX_PAIRS).contains(&stored.len()),
            "between one and Limiter::MAX_PAIRS pairs"
        );
        let call = Call::start(op.operation(), self.budget);
        let asked_at = self.store.local_now();
        let mut refreshes: Vec<Option<Refresh>> = Vec::with_capacity(stored.len());
        let mut cached: Vec<Option<Verdict>> = Vec::with_capacity(stored.len());
        for (i, (limit, key)) in stored.iter().enumerate() {
            if cost.get() > limit.max() {
                cached.push(Some(Verdict::over_max(limit)));
                refreshes.push(None);
                continue;
            }
            // A key given twice is looked up once: the second lookup would
            // find the first's claim to refresh, and refuse.
            if let Some(first) = stored[..i].iter().position(|(_, k)| k == key) {
                cached.push(cached[first].clone());
                refreshes.push(None);
                continue;
            }
            match self
                .refusals
                .get(key, (cost.get(), limit.max()), asked_at, self.budget)
            {
                Lookup::Refused(verdict) => {
                    cached.push(Some(verdict));
                    refreshes.push(None);
                }
                Lookup::Ask(refresh) => {
                    cached.push(None);
                    refreshes.push(refresh);
                }
            }
        }
        if cached.iter().all(Option::is_none) {
            return self.ask(op, &call, asked_at, stored, cost, refreshes).await;
        }
        // Refused without a round trip. A failure happened all the same: a
        // `failed` is counted under the other pairs. Other claims end here.
        let rest: Vec<(&Limit, String)> = stored
            .iter()
            .zip(&cached)
            .filter(|(_, cached)| cached.is_none())
            .map(|((limit, key), _)| (*limit, key.clone()))
            .collect();
        let mut asked = if op == Counting::FAILED && !rest.is_empty() {
            let refreshes = refreshes
                .into_iter()
                .zip(&cached)
                .filter(|(_, cached)| cached.is_none())
                .map(|(refresh, _)| refresh)
                .collect();
            Some(
                self.ask(op, &call, asked_at, &rest, cost, refreshes)
                    .await?
                    .into_iter(),
            )
        } else {
            drop(refreshes);
            None
        };
        Ok(stored
            .iter()
            .zip(cached)
            .map(|((limit, _), cached)| match cached {
                Some(verdict) => {
                    let source = if verdict.exceeds_max() {
                        Source::Cost
                    } else {
                        Source::Cache
                    };
                    call.record_from(limit, Outcome::Refused, source);
                    (verdict, CountedIn::Nowhere)
                }
                None => asked
                    .as_mut()
                    .and_then(Iterator::next)
                    .unwrap_or_else(|| (Verdict::not_asked(limit), CountedIn::Nowhere)),
            })
            .collect())
    }
}
