//! The store trait: what [`Limiter`](crate::Limiter) asks of
//! [`Postgres`](crate::Postgres) and [`Memory`](crate::Memory). Stores
//! count; [`decide`](crate::decide::decide) turns counts into verdicts, and
//! the SQL's `platformkit_at_max` (all-or-nothing, the listing) is held to
//! it by tests.

pub(crate) mod memory;
pub(crate) mod postgres;
pub(crate) mod sql;

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::decide::{Counted, Counting};
use crate::{AuditAction, AuditEntry, Error, Limit};

/// The most (limit, key) pairs one statement carries
/// ([`Limiter::MAX_PAIRS`](crate::Limiter::MAX_PAIRS)).
pub(crate) const MAX_PAIRS: usize = 64;

/// A store of counts: [`Postgres`](crate::Postgres) or
/// [`Memory`](crate::Memory). Sealed, as the limiter's promises belong to
/// these stores; bring your own connections through
/// [`LimitConn`](crate::LimitConn).
pub trait Store: sealed::Sealed {}

/// One (limit, stored key) pair of a statement over several, and what a
/// write adds to it.
#[derive(Clone, Copy, Debug)]
pub struct Asked<'a> {
    /// The limit.
    pub limit: &'a Limit,
    /// The stored key.
    pub key: &'a str,
    /// What a write adds (a read ignores it).
    pub n: u64,
}

/// Runs one counting operation over `pairs` in one statement of `store`:
/// the counts in the order given, and whether the asks were added (always,
/// but for an all-or-nothing call a pair refused).
pub(crate) async fn count_pairs<S: sealed::Sealed>(
    store: &S,
    op: Counting,
    pairs: &[Asked<'_>],
    deadline: Instant,
) -> Result<(Vec<Counted>, bool), Error> {
    match pairs {
        _ if op.all_or_nothing() => store.count_all_or_none(pairs, deadline).await,
        [one] => store
            .count(
                op,
                one.limit,
                one.key,
                one.n,
                deadline,
                &mut S::Held::default(),
            )
            .await
            .map(|counted| (vec![counted], true)),
        _ => store
            .count_many(op, pairs, deadline, &mut S::Held::default())
            .await
            .map(|counted| (counted, true)),
    }
}

pub(crate) mod sealed {
    use super::*;

    /// The methods of [`Store`], out of callers' reach.
    pub trait Sealed: Send + Sync + 'static {
        /// What one statement leaves for the next, in a run of statements
        /// one after another (a flight's): the source's connection, kept
        /// while it answers, and how long the last commit waited.
        type Held: Default + Send;

        /// How long the commit of the last write of `held` waited (its WAL
        /// flush), if the store says.
        fn commit_wait(_held: &Self::Held) -> Option<std::time::Duration> {
            None
        }

        /// This process's idea of the store's time; the refusal cache's.
        fn local_now(&self) -> SystemTime;

        /// Whether the latest probe found the store down
        /// ([down or overloaded](crate::guide#down-or-overloaded)).
        fn down_before(&self) -> impl Future<Output = bool> + Send;

        /// Whether the store is down for a call that got `error`, no
        /// answer: a probe of the server says.
        fn down_after(&self, error: &Error) -> impl Future<Output = bool> + Send;

        /// Runs one counting operation for the stored key `key` under
        /// `limit`, finishing by `deadline`; a write adds `n`. On the
        /// connection `held`, if any, and leaves it there if it answered.
        fn count(
            &self,
            op: Counting,
            limit: &Limit,
            key: &str,
            n: u64,
            deadline: Instant,
            held: &mut Self::Held,
        ) -> impl Future<Output = Result<Counted, Error>> + Send;

        /// [`count`](Sealed::count) over several pairs in one statement;
        /// the counts in the order given.
        fn count_many(
            &self,
            op: Counting,
            asked: &[Asked<'_>],
            deadline: Instant,
            held: &mut Self::Held,
        ) -> impl Future<Output = Result<Vec<Counted>, Error>> + Send;

        /// Adds each pair's `n` in one statement only if every pair's ask
        /// may go ahead (as [`decide`](crate::decide::decide) decides a
        /// `hit`), the stored keys all different: the counts after (before,
        /// when nothing was added), in the order given, and whether it
        /// added. A call not counted leaves no count, window or lock.
        fn count_all_or_none(
            &self,
            asked: &[Asked<'_>],
            deadline: Instant,
        ) -> impl Future<Output = Result<(Vec<Counted>, bool), Error>> + Send;

        /// Takes `n` back from the stored key's count in the window that
        /// starts at `window_start` (never below zero); returns the count.
        fn take_back(
            &self,
            key: &str,
            window_start: SystemTime,
            n: u64,
            deadline: Instant,
        ) -> impl Future<Output = Result<u64, Error>> + Send;

        /// The stored keys beginning with `prefix` (the limit's name and
        /// `|`) that `limit` refuses now, at most `at_most`, in the order of
        /// [`Limiter::refused_keys`](crate::Limiter::refused_keys), each with
        /// what a `check` would read. Nothing is counted.
        fn refused(
            &self,
            limit: &Limit,
            prefix: &str,
            at_most: usize,
            deadline: Instant,
        ) -> impl Future<Output = Result<Vec<(String, Counted)>, Error>> + Send;

        /// Records `limit`'s definition ([`Limit::defined`]), replacing
        /// another under its name.
        fn define(
            &self,
            limit: &Limit,
            deadline: Instant,
        ) -> impl Future<Output = Result<(), Error>> + Send;

        /// The limits recorded, by name.
        fn limits(
            &self,
            deadline: Instant,
        ) -> impl Future<Output = Result<Vec<Limit>, Error>> + Send;

        /// An operator's `action` on the stored key `key`, audited with who
        /// did it and why (`who`); a block lasts `block_for`. How many rows
        /// went, and a block's end.
        fn operate(
            &self,
            action: AuditAction,
            key: &str,
            block_for: Duration,
            who: (&str, &str),
            deadline: Instant,
        ) -> impl Future<Output = Result<(u64, Option<SystemTime>), Error>> + Send;

        /// The audit of the stored keys beginning with `prefix`, newest
        /// first, at most `at_most` entries.
        fn audit(
            &self,
            prefix: &str,
            at_most: usize,
            deadline: Instant,
        ) -> impl Future<Output = Result<Vec<AuditEntry>, Error>> + Send;

        /// Clears the stored key `key`; returns how many windows went.
        fn reset(
            &self,
            key: &str,
            deadline: Instant,
        ) -> impl Future<Output = Result<u64, Error>> + Send;
    }
}
