//! The part of a call that goes to the store, and what an unreachable or
//! overloaded store makes of it.

use std::num::NonZeroU32;
use std::sync::Arc;

use super::permit::CountedIn;
use crate::cache::Refresh;
use crate::call::Call;
use crate::decide::decide;
use crate::metric::Outcome;
use crate::operation::Counting;
use crate::store::{Asked, Store, count_pairs};
use crate::{Error, Limit, Limiter, Verdict, WhenUnreachable};

impl<S: Store> Limiter<S> {
    /// Asks the store for the pairs in one statement, each with its claim to
    /// refresh a cached refusal, if it holds one.
    pub(super) async fn ask(
        &self,
        op: Counting,
        call: &Call,
        asked_at: std::time::SystemTime,
        stored: &[(&Limit, String)],
        cost: NonZeroU32,
        refreshes: Vec<Option<Refresh>>,
    ) -> Result<Vec<(Verdict, CountedIn)>, Error> {
        debug_assert!(!stored.is_empty(), "a statement for no pairs");
        debug_assert_eq!(stored.len(), refreshes.len(), "one claim per pair");
        let deadline = call.deadline();
        let n = u64::from(cost.get());
        // The counts, and whether the cost was added (not by an
        // all-or-nothing call a pair refused). Boxed: a store's future is
        // large, and a caller's should not carry it.
        let counting = Box::pin(async {
            let asked: Vec<Asked<'_>> = stored
                .iter()
                .map(|(limit, key)| Asked { limit, key, n })
                .collect();
            match &self.merging {
                Some(merging) => merging.count(&self.store, op, &asked, deadline).await,
                None => count_pairs(&*self.store, op, &asked, deadline).await,
            }
        });
        match call.within_store(&*self.store, counting).await {
            Ok((counted, added)) => {
                // One count per pair, in order (`Postgres` errs otherwise).
                debug_assert_eq!(counted.len(), stored.len(), "one count per pair");
                let verdicts = stored
                    .iter()
                    .zip(&counted)
                    .map(|((limit, _), counted)| {
                        if added {
                            decide(op, limit, cost.get(), counted)
                        } else {
                            // Not counted: what an ask of the cost finds.
                            decide(Counting::CHECK, limit, cost.get(), counted)
                        }
                    })
                    .collect();
                let verdicts = refused_unless_added(added, verdicts);
                Ok(stored
                    .iter()
                    .zip(counted)
                    .zip(verdicts)
                    .zip(refreshes)
                    .map(|((((limit, key), counted), verdict), refresh)| {
                        self.refusals.answered(
                            key,
                            &verdict,
                            (cost.get(), limit.max()),
                            asked_at,
                            refresh,
                        );
                        call.record(limit, Outcome::of(&verdict));
                        let counted_in = if added {
                            let window_start = counted.window_start(limit);
                            CountedIn::Store { window_start }
                        } else {
                            CountedIn::Nowhere
                        };
                        (verdict, counted_in)
                    })
                    .collect())
            }
            Err(e) if e.is_unreachable() => {
                let cause = Arc::new(e);
                Ok(stored
                    .iter()
                    .zip(refreshes)
                    .map(|((limit, key), refresh)| {
                        self.refusals.unanswered(refresh);
                        call.record_unreachable(limit, &cause);
                        self.when_unreachable(op, limit, key, cost, cause.clone())
                    })
                    .collect())
            }
            Err(e) if e.is_overloaded() => {
                let cause = Arc::new(e);
                Ok(stored
                    .iter()
                    .zip(refreshes)
                    .map(|((limit, _), refresh)| {
                        self.refusals.unanswered(refresh);
                        call.record_shed(limit, &cause);
                        (Verdict::shed_by(limit, cause.clone()), CountedIn::Nowhere)
                    })
                    .collect())
            }
            Err(e) => {
                for (limit, _) in stored {
                    call.record(limit, Outcome::Error);
                }
                Err(e)
            }
        }
    }

    /// The verdict when the store could not be reached: the limit decides.
    pub(super) fn when_unreachable(
        &self,
        op: Counting,
        limit: &Limit,
        key: &str,
        cost: NonZeroU32,
        cause: Arc<Error>,
    ) -> (Verdict, CountedIn) {
        match limit.when_unreachable() {
            WhenUnreachable::Refuse => {
                (Verdict::uncounted(limit, false, cause), CountedIn::Nowhere)
            }
            WhenUnreachable::CountLocally => {
                // On the store's clock, so the local count agrees with it.
                let counted = self.fallback.count_at(
                    op,
                    limit,
                    key,
                    cost.get().into(),
                    self.store.local_now(),
                );
                match counted {
                    Some(counted) => {
                        let window_start = counted.window_start(limit);
                        (
                            decide(op, limit, cost.get(), &counted).because_unreachable(cause),
                            CountedIn::Fallback { window_start },
                        )
                    }
                    // No room to count the key: refused, as `Refuse` would.
                    None => (Verdict::uncounted(limit, false, cause), CountedIn::Nowhere),
                }
            }
            WhenUnreachable::Allow => (Verdict::uncounted(limit, true, cause), CountedIn::Nowhere),
        }
    }
}

/// A call whose cost was not `added` is refused: should every verdict
/// allow it (the store and the crate disagreeing), each becomes a refusal
/// that reopens at once, so that nothing goes ahead uncounted.
fn refused_unless_added(added: bool, verdicts: Vec<Verdict>) -> Vec<Verdict> {
    if added || verdicts.iter().any(Verdict::is_refused) {
        return verdicts;
    }
    verdicts.into_iter().map(Verdict::refused_now).collect()
}
