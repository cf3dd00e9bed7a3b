//! The store trait: what [`Limiter`](crate::Limiter) asks of
//! [`Postgres`](crate::Postgres) and [`Memory`](crate::Memory).
//!
//! Stores load and store counts; the verdict is decided by
//! [`decide`](crate::decide::decide), shared by both. The SQL decides in
//! one function of its own, `platformkit_at_max`, for all-or-nothing and the
//! operator's listing; the agreement tests hold it to `decide`.

pub(crate) mod budget;
pub(crate) mod health;
pub(crate) mod memory;
pub(crate) mod postgres;
pub(crate) mod sql;
pub(crate) mod statement;

use std::future::Future;
use std::time::SystemTime;

use tokio::time::Instant;

use crate::decide::Counted;
use crate::operation::Counting;
use crate::{Error, Limit};

/// The most (limit, key) pairs one statement carries: one call's
/// ([`Limiter::MAX_PAIRS`](crate::Limiter::MAX_PAIRS)), or one flight's of
/// merged keys.
pub(crate) const MAX_PAIRS: usize = 64;

/// A store of counts: [`Postgres`](crate::Postgres) or
/// [`Memory`](crate::Memory).
///
/// The trait is sealed: the limiter's promises (one statement, one round
/// trip, the system switch, the budget) belong to the stores this crate
/// ships. To bring your own connections, implement
/// [`LimitConn`](crate::LimitConn) instead.
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

pub(crate) mod sealed {
    use super::*;

    /// The methods of [`Store`], out of callers' reach.
    pub trait Sealed: Send + Sync + 'static {
        /// This process's idea of the store's time: the pinned clock's, or
        /// the system's. The refusal cache runs on it.
        fn local_now(&self) -> SystemTime;

        /// Whether the store is down for a call about to try it: the
        /// latest probe found it down (the guide's
        /// [down or overloaded](crate::guide#down-or-overloaded)).
        fn down_before(&self) -> impl Future<Output = bool> + Send;

        /// Whether the store is down for a call that got no answer
        /// (`error`, which [`Error::is_unreachable`] reads so): a probe of
        /// the server says.
        fn down_after(&self, error: &Error) -> impl Future<Output = bool> + Send;

        /// Runs one counting operation for the stored key `key` under
        /// `limit`, finishing by `deadline`; a write adds `n`.
        fn count(
            &self,
            op: Counting,
            limit: &Limit,
            key: &str,
            n: u64,
            deadline: Instant,
        ) -> impl Future<Output = Result<Counted, Error>> + Send;

        /// Runs one counting operation over several (limit, stored key)
        /// pairs in one statement, a write adding each pair's `n`; the
        /// counts come back in the order given.
        fn count_many(
            &self,
            op: Counting,
            asked: &[Asked<'_>],
            deadline: Instant,
        ) -> impl Future<Output = Result<Vec<Counted>, Error>> + Send;

        /// Adds each pair's `n` in one statement only if every pair's ask
        /// of its `n` may go ahead (as [`decide`](crate::decide::decide)
        /// decides a `hit`), the stored keys all different: the counts
        /// after the call, in the order given (those before it when
        /// nothing was added), and whether the amounts were added. Nothing
        /// is left of a call not counted: no count, no window, no lock.
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

        /// The stored keys under `limit` that begin with `prefix` (the
        /// limit's name and `|`) and that `limit` refuses now, at most
        /// `at_most` of them, newest first (the latest window counted in,
        /// then the highest current count, then the key), each with what a
        /// `check` would read of it. Nothing is counted.
        fn refused(
            &self,
            limit: &Limit,
            prefix: &str,
            at_most: usize,
            deadline: Instant,
        ) -> impl Future<Output = Result<Vec<(String, Counted)>, Error>> + Send;

        /// Clears the stored key `key`; returns how many windows went.
        fn reset(
            &self,
            key: &str,
            deadline: Instant,
        ) -> impl Future<Output = Result<u64, Error>> + Send;
    }
}
