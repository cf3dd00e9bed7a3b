//! The several-limits calls, one statement over several (limit, key)
//! pairs; and
//! `run_all`, the one path of every counting call, one pair or several,
//! whatever its cost.

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
    /// [`check`](Limiter::check) over several (limit, key) pairs in one
    /// statement and one round trip: a login's per-account and per-address
    /// limits at once. The verdicts come back in the order given;
    /// [`Verdicts::refused_by`] says which limit refused.
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

    /// [`failed`](Limiter::failed) over several (limit, key) pairs in one
    /// statement and one round trip. Rows are locked in one order whatever
    /// the order given, so concurrent calls cannot deadlock.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`].
    pub async fn failed_all(&self, pairs: &[(&Limit, &Key)]) -> Result<Verdicts, Error> {
        self.counted_all(Counting::FAILED, pairs, NonZeroU32::MIN)
            .await
    }

    /// [`hit`](Limiter::hit) over several (limit, key) pairs in one
    /// statement and one round trip: the ask is counted under every limit,
    /// and may go ahead only if every limit allows it.
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

    /// [`hit_all`](Limiter::hit_all), all or nothing: the ask's cost
    /// is counted under every limit if every limit allows it, and under
    /// none if one refuses. For quotas: a refusal by the per-second limit
    /// does not spend the per-day quota. `hit_all` stays attack
    /// accounting, where every ask counts.
    ///
    /// One statement and one round trip, as `hit_all`: the rows are locked
    /// in one order whatever the order given, so concurrent calls cannot
    /// deadlock, and each limit is decided on its count under that lock, so
    /// concurrent asks never together go past a limit. The verdicts come
    /// back in the order given. When one refuses, nothing is counted, and
    /// each verdict tells what the ask found under its limit (the others
    /// may allow it); [`Verdicts::refused_by`] names the first refusal.
    ///
    /// A cost above a pair's `max`, a refusal the refusal cache answers, an
    /// unreachable or a busy store are as [`hit_all`](Limiter::hit_all)
    /// says; while the store is unreachable, a limit that
    /// [counts locally](crate::WhenUnreachable::CountLocally) counts the ask
    /// under its own limit whatever the others say. The call is a statement
    /// of its own, never merged with other callers' (see the guide's
    /// [merging](crate::guide#merging)).
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
    /// (limit, key) pair given twice: each pair is decided by its own
    /// count.
    pub fn hit_all_or_nothing<'l, 'p>(
        &'l self,
        pairs: &'p [(&'p Limit, &'p Key)],
    ) -> Ask<'l, 'p, S, Verdicts> {
        Ask::all(self, Counting::HIT_ALL_OR_NOTHING, pairs)
    }

    async fn counted_all(
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

    /// Runs one counting operation of `cost` over several pairs in one
    /// statement: each pair's verdict and where (and in which window) it
    /// was counted.
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

    /// Runs one counting operation of `cost` over one or several (limit,
    /// stored key) pairs: the one path of every call, whatever its number
    /// of pairs and its [cost](Ask::cost).
    ///
    /// A cost above a pair's `max` first: that pair is refused at once
    /// ([`Verdict::exceeds_max`]). Then the refusal cache, by cost. A pair
    /// refused by either refuses the call, and
    /// no statement is sent for any pair (the pairs not asked are allowed by
    /// their own limits, with nothing counted). Then one statement: a write
    /// through merging when it is on, each pair a caller of its own key; a
    /// read, or a write with merging off, as one statement of its own. Then
    /// each pair's verdict: decided by its count, or by its limit's
    /// [`WhenUnreachable`](crate::WhenUnreachable) when the store is down,
    /// or shed when it is overloaded.
    pub(crate) async fn run_all(
        &self,
        op: Counting,
        stored: &[(&Limit, String)],
        cost: NonZeroU32,
    ) -> Result<Vec<(Verdict, CountedIn)>, Error> {
        // Its callers give one pair (`run`) or have checked the number
        // (`counted_all_in`): one statement takes them all.
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
                // No window ever allows it: refused before any lookup.
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
        // Refused without a round trip. A failure happened all the same: it
        // is still counted under the pairs the cache does not answer, so
        // that no limit of the call under-counts a burst. Any other call
        // asks the store nothing; the claims of the others end here.
        let rest: Vec<(&Limit, String)> = stored
            .iter()
            .zip(&cached)
            .filter(|(_, cached)| cached.is_none())
            .map(|((limit, key), _)| (*limit, key.clone()))
            .collect();
        // (A `failed` costs 1, which no limit's max is below: only the
        // refusal cache answers one.)
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
