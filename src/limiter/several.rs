//! The several-limits calls: `check_all`, `failed_all`, `hit_all`, one
//! statement over several (limit, key) pairs.

use std::sync::Arc;

use snafu::ensure;

use crate::call::Call;
use crate::decide::decide;
use crate::error::InvalidOptionSnafu;
use crate::key::stored;
use crate::metric::Outcome;
use crate::permit::CountedIn;
use crate::store::{Asked, Op, Store};
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
        self.counted_all(Op::Check, pairs).await
    }

    /// [`failed`](Limiter::failed) over several (limit, key) pairs in one
    /// statement and one round trip. Rows are locked in one order whatever
    /// the order given, so concurrent calls cannot deadlock.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`].
    pub async fn failed_all(&self, pairs: &[(&Limit, &Key)]) -> Result<Verdicts, Error> {
        self.counted_all(Op::Failed, pairs).await
    }

    /// [`hit`](Limiter::hit) over several (limit, key) pairs in one
    /// statement and one round trip: the ask is counted under every limit,
    /// and may go ahead only if every limit allows it.
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_all`].
    pub async fn hit_all(&self, pairs: &[(&Limit, &Key)]) -> Result<Verdicts, Error> {
        self.counted_all(Op::Hit, pairs).await
    }

    async fn counted_all(&self, op: Op, pairs: &[(&Limit, &Key)]) -> Result<Verdicts, Error> {
        let counted = self.counted_all_in(op, pairs).await?;
        Ok(Verdicts::from_vec(
            counted.into_iter().map(|(verdict, _)| verdict).collect(),
        ))
    }

    /// Runs one counting operation over several pairs in one statement:
    /// each pair's verdict and where (and in which window) it was counted.
    pub(crate) async fn counted_all_in(
        &self,
        op: Op,
        pairs: &[(&Limit, &Key)],
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
        let asked: Vec<Asked<'_>> = stored
            .iter()
            .map(|(limit, key)| Asked { limit, key, n: 1 })
            .collect();
        let call = Call::start(op.into(), self.budget);
        let result = call
            .within(self.store.count_many(op, &asked, call.deadline()))
            .await;
        match result {
            Ok(counted) => {
                let mut verdicts = Vec::with_capacity(stored.len());
                for ((limit, _), counted) in stored.iter().zip(&counted) {
                    let verdict = decide(op, limit, counted);
                    call.record(limit, Outcome::of(&verdict));
                    let window_start = counted.window_start(limit);
                    verdicts.push((verdict, CountedIn::Store { window_start }));
                }
                Ok(verdicts)
            }
            Err(e) if e.is_unreachable() => {
                let cause = Arc::new(e);
                let mut verdicts = Vec::with_capacity(stored.len());
                for (limit, key) in &stored {
                    call.record_unreachable(limit, &cause);
                    verdicts.push(self.when_unreachable(op, limit, key, cause.clone()));
                }
                Ok(verdicts)
            }
            Err(e) => {
                for (limit, _) in &stored {
                    call.record(limit, Outcome::Error);
                }
                Err(e)
            }
        }
    }
}
