//! [`Postgres`]: the real store. A limit is a row.

use std::time::SystemTime;

use tokio::time::Instant;

use snafu::ensure;

use crate::clock::Clock;
use crate::driver::{Row, Session};
use crate::error::{AnsweredAfterCancelSnafu, InvalidOptionSnafu, UnexpectedSnafu};
use crate::operation::Operation;
use crate::store::sql::{self, Budget, Statement};
use crate::store::{Asked, Counted, Op, Store, sealed};
use crate::{Error, ErrorKind, Limit, LimitConn, ManualClock, Strategy};

/// The real store: each key's count in each window is a row of
/// `platformkit_limits`, shared by every replica and kept across deploys.
///
/// Each call borrows one connection from the caller's [`LimitConn`] and sends
/// one statement: a write is a `CALL` of the limiter's procedure, which runs
/// inside the limiter's own short system transaction; a read is a `SELECT`
/// of its function, which needs no transaction of its own. One message, one
/// network round trip. Keys travel only as bind parameters. The window
/// comes from the database's clock. The [guide](crate::guide#one-calls-path)
/// follows one call through it.
///
/// ```no_run
/// use platformkit_limit::{Key, Limit, Limiter, Postgres};
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), platformkit_limit::Error> {
/// let config: tokio_postgres::Config = "host=localhost user=app dbname=app".parse().unwrap();
/// let limiter = Limiter::new(Postgres::new(config));
/// let login = Limit::new("login", 10, Duration::from_secs(15 * 60))?;
/// let verdict = limiter.check(&login, &Key::opaque("account-42")).await?;
/// assert!(verdict.is_allowed());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Postgres<C> {
    conns: C,
    clock: Clock,
    relaxed: bool,
}

impl<C: LimitConn> Postgres<C> {
    /// A store that borrows its connections from `conns` for each call.
    pub fn new(conns: C) -> Self {
        Postgres {
            conns,
            clock: Clock::Store,
            relaxed: false,
        }
    }

    /// Reads the time from `clock` instead of the database: for tests that
    /// pin the time. Every replica must then share the clock.
    pub fn with_clock(mut self, clock: ManualClock) -> Self {
        self.clock = Clock::Manual(clock);
        self
    }

    /// Commits the limiter's transactions without waiting for their WAL
    /// flush: `synchronous_commit = off` for those transactions only, never
    /// for the caller's. The default is durable.
    ///
    /// What it can lose, exactly: when the **server crashes** (not when a
    /// client or a connection fails), the calls it acknowledged in the last
    /// moments before the crash, at most three times `wal_writer_delay` (600
    /// ms with the default of 200 ms), come back uncounted: those failures
    /// and asks are forgotten and the rows hold their earlier counts. Nothing
    /// is corrupted, no other transaction is affected, and a crash of the
    /// limiter's process loses nothing.
    pub fn with_relaxed_durability(mut self) -> Self {
        self.relaxed = true;
        self
    }

    /// The connection source.
    pub fn conns(&self) -> &C {
        &self.conns
    }

    /// The pinned time, if the clock is pinned: within the years the
    /// procedures accept (1900 to 2199).
    fn pinned(&self) -> Result<Option<SystemTime>, Error> {
        let Some(pinned) = self.clock.pinned() else {
            return Ok(None);
        };
        let secs = match pinned.duration_since(std::time::UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
        };
        ensure!(
            (sql::MIN_PINNED_UNIX_SECS..sql::END_PINNED_UNIX_SECS).contains(&secs),
            InvalidOptionSnafu {
                option: "clock",
                reason: "a pinned clock must be within the years 1900 to 2199",
            }
        );
        Ok(Some(pinned))
    }

    async fn connection(&self, operation: Operation) -> Result<C::Conn, Error> {
        self.conns
            .conn()
            .await
            .map_err(|e| Error::connect(operation, e.into()))
    }
}

impl<C: LimitConn> Store for Postgres<C> {}

impl<C: LimitConn> sealed::Sealed for Postgres<C> {
    fn local_now(&self) -> SystemTime {
        self.clock.local_now()
    }

    async fn count(
        &self,
        op: Op,
        limit: &Limit,
        key: &str,
        n: u64,
        deadline: Instant,
    ) -> Result<Counted, Error> {
        let operation = Operation::from(op);
        // A pinned clock out of bounds is refused before a connection is taken.
        let pinned = self.pinned()?;
        let mut conn = self.connection(operation).await?;
        let window = i64::try_from(limit.window_secs()).expect("windows are at most 366 days");
        let budget = Budget::until(deadline);
        let previous = limit.strategy() == Strategy::Sliding;
        let max = i64::from(limit.max());
        let lockout = i64::try_from(limit.lockout_secs()).expect("at most a day");
        let row = match op {
            Op::Check => {
                let read = sql::Read {
                    key,
                    window_secs: window,
                    at: pinned,
                    budget_ms: budget.server_ms,
                    previous,
                    max,
                    lockout_secs: lockout,
                };
                call(&mut conn, operation, read.statement(), budget).await?
            }
            Op::Failed | Op::Hit | Op::Reserve => {
                let add = sql::Add {
                    key,
                    add: i64::try_from(n).unwrap_or(i64::MAX),
                    window_secs: window,
                    at: pinned,
                    budget_ms: budget.server_ms,
                    relaxed: self.relaxed,
                    previous,
                    max,
                    lockout_secs: lockout,
                };
                call(&mut conn, operation, add.statement(), budget).await?
            }
        };
        let get = |e| Error::from_call(operation, e, false);
        let count: i64 = row.get(0).map_err(get)?;
        let window_end: SystemTime = row.get(1).map_err(get)?;
        let now: SystemTime = row.get(2).map_err(get)?;
        let previous: i64 = row.get(3).map_err(get)?;
        let locked_until: Option<SystemTime> = row.get(4).map_err(get)?;
        Ok(Counted {
            count: stored_count(count),
            previous: stored_count(previous),
            locked_until,
            window_end,
            now,
        })
    }

    async fn count_many(
        &self,
        op: Op,
        asked: &[Asked<'_>],
        deadline: Instant,
    ) -> Result<Vec<Counted>, Error> {
        let operation = Operation::from(op);
        let pinned = self.pinned()?;
        let mut conn = self.connection(operation).await?;
        let keys: Vec<&str> = asked.iter().map(|pair| pair.key).collect();
        let windows: Vec<i64> = asked
            .iter()
            .map(|pair| i64::try_from(pair.limit.window_secs()).expect("at most 366 days"))
            .collect();
        let budget = Budget::until(deadline);
        let previous = asked
            .iter()
            .any(|pair| pair.limit.strategy() == Strategy::Sliding);
        let maxes: Vec<i64> = asked.iter().map(|p| i64::from(p.limit.max())).collect();
        let lockouts: Vec<i64> = asked
            .iter()
            .map(|p| i64::try_from(p.limit.lockout_secs()).expect("at most a day"))
            .collect();
        let row = match op {
            Op::Check => {
                let read = sql::ReadMany {
                    keys: &keys,
                    window_secs: &windows,
                    at: pinned,
                    budget_ms: budget.server_ms,
                    previous,
                    maxes: &maxes,
                    lockout_secs: &lockouts,
                };
                call(&mut conn, operation, read.statement(), budget).await?
            }
            Op::Failed | Op::Hit | Op::Reserve => {
                let adds: Vec<i64> = asked
                    .iter()
                    .map(|pair| i64::try_from(pair.n).unwrap_or(i64::MAX))
                    .collect();
                let add = sql::AddMany {
                    keys: &keys,
                    window_secs: &windows,
                    adds: &adds,
                    at: pinned,
                    budget_ms: budget.server_ms,
                    relaxed: self.relaxed,
                    previous,
                    maxes: &maxes,
                    lockout_secs: &lockouts,
                };
                call(&mut conn, operation, add.statement(), budget).await?
            }
        };
        let get = |e| Error::from_call(operation, e, false);
        let counts: Vec<i64> = row.get(0).map_err(get)?;
        let window_ends: Vec<SystemTime> = row.get(1).map_err(get)?;
        let now: SystemTime = row.get(2).map_err(get)?;
        let previous: Vec<i64> = row.get(3).map_err(get)?;
        let locked_until: Vec<Option<SystemTime>> = row.get(4).map_err(get)?;
        ensure!(
            [
                window_ends.len(),
                previous.len(),
                locked_until.len(),
                asked.len()
            ]
            .iter()
            .all(|&n| n == counts.len()),
            UnexpectedSnafu {
                operation,
                what: "a different number of counts than pairs asked",
            }
        );
        Ok(counts
            .into_iter()
            .zip(window_ends)
            .zip(previous)
            .zip(locked_until)
            .map(|(((count, window_end), previous), locked_until)| Counted {
                count: stored_count(count),
                previous: stored_count(previous),
                locked_until,
                window_end,
                now,
            })
            .collect())
    }

    async fn take_back(
        &self,
        key: &str,
        window_start: SystemTime,
        n: u64,
        deadline: Instant,
    ) -> Result<u64, Error> {
        let mut conn = self.connection(Operation::TakeBack).await?;
        let budget = Budget::until(deadline);
        let take_back = sql::TakeBack {
            key,
            window_start,
            n: i64::try_from(n).unwrap_or(i64::MAX),
            budget_ms: budget.server_ms,
            relaxed: self.relaxed,
        };
        let row = call(
            &mut conn,
            Operation::TakeBack,
            take_back.statement(),
            budget,
        )
        .await?;
        deleted(&row, Operation::TakeBack)
    }

    async fn reset(&self, key: &str, deadline: Instant) -> Result<u64, Error> {
        let mut conn = self.connection(Operation::Reset).await?;
        let budget = Budget::until(deadline);
        let reset = sql::Reset {
            key,
            budget_ms: budget.server_ms,
            relaxed: self.relaxed,
        };
        let row = call(&mut conn, Operation::Reset, reset.statement(), budget).await?;
        deleted(&row, Operation::Reset)
    }
}

/// A count as stored. The table's CHECK keeps counts non-negative; were one
/// ever negative, refusing is the safe reading.
fn stored_count(count: i64) -> u64 {
    u64::try_from(count).unwrap_or(u64::MAX)
}

/// Sends one statement on `session` and returns its one row.
///
/// The statement runs in autocommit: a `CALL` whose procedure opens and ends
/// the limiter's own transaction, or a `SELECT` of a reader, which writes
/// nothing. A caller that gives up on the future (the budget) cannot leave
/// the connection inside a transaction: the request is already queued on the
/// connection, and the server finishes it alone.
///
/// The server stops too, as [`Budget`] splits the time: its lock waits end
/// at `lock_timeout` (a hard error), and, on a driver that can cancel
/// (tokio-postgres), a `CALL` still unanswered at `budget.cancel_at` is sent
/// a cancel request (what psql's Ctrl-C sends, over a new connection without
/// TLS; a server that requires TLS refuses it and the lock timeout still
/// holds). The cancel is sent while this call still holds the connection, so
/// it can only reach this `CALL`: through PgBouncer, a client that holds no
/// server connection has nothing to cancel. A cancel this call did not send
/// is a hard error; an answer that comes after this call's cancel is the
/// budget running out, never an acknowledgement (a commit waiting for a
/// synchronous standby is answered when cancelled, without the standby). A
/// driver that cannot cancel (sqlx) sends none: the client gives up at the
/// deadline and the server finishes the `CALL` alone.
///
/// A connection handed over inside the caller's transaction makes the
/// procedure fail before it does anything; that transaction, now aborted, is
/// rolled back so that the connection goes back idle.
pub(crate) async fn call<S: Session, const N: usize>(
    session: &mut S,
    operation: Operation,
    statement: Statement<'_, N>,
    budget: Budget,
) -> Result<Row, Error> {
    crate::metric::statement_sent(operation);
    let (answer, cancel_sent) = session
        .send(statement.sql, &statement.params, budget.cancel_at)
        .await;
    match answer {
        Ok(_) if cancel_sent => AnsweredAfterCancelSnafu { operation }
            .fail()
            .map_err(Error::from),
        Ok(row) => Ok(row),
        Err(e) => {
            let error = Error::from_call(operation, e, cancel_sent);
            if error.kind() == ErrorKind::InTransaction {
                // Best effort: the error says what happened either way.
                session.rollback().await;
            }
            Err(error)
        }
    }
}

/// Reads the one count column of a reset, purge or take-back.
pub(crate) fn deleted(row: &Row, operation: Operation) -> Result<u64, Error> {
    let deleted: i64 = row
        .get(0)
        .map_err(|e| Error::from_call(operation, e, false))?;
    Ok(u64::try_from(deleted).unwrap_or(0))
}
