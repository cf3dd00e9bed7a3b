//! The store trait: what [`Limiter`](crate::Limiter) asks of
//! [`Postgres`](crate::Postgres) and [`Memory`](crate::Memory).
//!
//! Stores only load and store counts; the verdict is decided by
//! [`decide`](crate::decide::decide), shared by both.

pub(crate) mod budget;
pub(crate) mod health;
pub(crate) mod memory;
pub(crate) mod postgres;
pub(crate) mod purge;
pub(crate) mod sql;
pub(crate) mod statement;

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use tokio::time::Instant;

use crate::decide::Counted;
use crate::operation::Counting;
use crate::{Error, Limit};

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

/// How far a store's call got, as the store reports it: read when a
/// caller's budget runs out before the answer, to tell a server that is
/// down from one that is busy (the guide's
/// [down or overloaded](crate::guide#down-or-overloaded)). Shared by the
/// callers of a merged statement.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<AtomicU8>);

/// A step of [`Progress`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Not begun: queued behind this limiter's other statements.
    Queued,
    /// Asking the connection source for a connection.
    Connecting,
    /// The statement was sent, and is not answered yet.
    Sent,
    /// The statement was sent and is not answered yet, and the server took
    /// this call's cancel request: it accepted a connection and read the
    /// request, so it is up, whatever becomes of the statement.
    CancelDelivered,
}

impl Progress {
    /// The step reached.
    pub(crate) fn phase(&self) -> Phase {
        match self.0.load(Ordering::Relaxed) {
            0 => Phase::Queued,
            1 => Phase::Connecting,
            2 => Phase::Sent,
            _ => Phase::CancelDelivered,
        }
    }

    /// Notes that the call reached `phase`.
    pub(crate) fn reached(&self, phase: Phase) {
        let step = match phase {
            Phase::Queued => 0,
            Phase::Connecting => 1,
            Phase::Sent => 2,
            Phase::CancelDelivered => 3,
        };
        self.0.store(step, Ordering::Relaxed);
    }
}

/// Where a caller reads the progress of the statement that carries its
/// count, and that statement's deadline: a merged caller's is set when a
/// flight takes it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Watch(Arc<OnceLock<(Progress, Instant)>>);

impl Watch {
    /// Follows `progress`, the statement this caller is in, which runs
    /// until `deadline`.
    pub(crate) fn follow(&self, progress: &Progress, deadline: Instant) {
        let _ = self.0.set((progress.clone(), deadline));
    }

    /// The step reached, for a caller whose budget ends at `deadline`:
    /// [`Phase::Queued`] until a statement is begun, and while it is sent
    /// with budget left after this caller's (it may still be answered).
    pub(crate) fn phase_for(&self, deadline: Instant) -> Phase {
        match self.0.get() {
            None => Phase::Queued,
            Some((progress, until)) => match progress.phase() {
                Phase::Sent | Phase::CancelDelivered if *until > deadline => Phase::Queued,
                phase => phase,
            },
        }
    }
}

pub(crate) mod sealed {
    use super::*;

    /// The methods of [`Store`], out of callers' reach.
    pub trait Sealed: Send + Sync + 'static {
        /// This process's idea of the store's time: the pinned clock's, or
        /// the system's. The refusal cache runs on it.
        fn local_now(&self) -> SystemTime;

        /// Whether the store is down, by what it heard, for a call that
        /// began at `since` and ran out of budget with its statement at
        /// `phase` (the guide's
        /// [down or overloaded](crate::guide#down-or-overloaded)).
        fn down_since(&self, since: Instant, phase: Phase) -> bool;

        /// Runs one counting operation for the stored key `key` under
        /// `limit`, finishing by `deadline`; a write adds `n`. How far it
        /// got goes to `progress`.
        fn count(
            &self,
            op: Counting,
            limit: &Limit,
            key: &str,
            n: u64,
            deadline: Instant,
            progress: &Progress,
        ) -> impl Future<Output = Result<Counted, Error>> + Send;

        /// Runs one counting operation over several (limit, stored key)
        /// pairs in one statement, a write adding each pair's `n`; the
        /// counts come back in the order given.
        fn count_many(
            &self,
            op: Counting,
            asked: &[Asked<'_>],
            deadline: Instant,
            progress: &Progress,
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
            progress: &Progress,
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
