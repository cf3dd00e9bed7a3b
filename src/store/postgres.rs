//! [`Postgres`]: the real store. A limit is a row.

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, timeout_at};

use snafu::ensure;

use crate::clock::Clock;
use crate::decide::{Counted, Op};
use crate::driver::{Failure, Row, Session};
use crate::error::{AnsweredAfterCancelSnafu, InvalidOptionSnafu, UnexpectedSnafu};
use crate::operation::Operation;
use crate::store::health::Health;
use crate::store::sql::{self, Budget, Statement};
use crate::store::{Asked, Phase, Progress, Store, sealed};
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
    /// What this store last heard from the server: down, or overloaded.
    health: Health,
}

impl<C: LimitConn> Postgres<C> {
    /// A store that borrows its connections from `conns` for each call.
    pub fn new(conns: C) -> Self {
        Postgres {
            conns,
            clock: Clock::Store,
            relaxed: false,
            health: Health::default(),
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

    /// Applies [`SCHEMA`](crate::SCHEMA) through one connection of the
    /// source: the service's start-up step, safe to run again (on every
    /// start, by every replica at once). The role that runs it owns the
    /// schema and needs no [`grants`](crate::grants); a service that runs as
    /// another role runs `grants(role)` as the owner after it.
    ///
    /// The script waits for its locks as a migration does (it takes the
    /// table's strongest lock only when it changes the table), so it has
    /// no budget: run it before serving.
    ///
    /// ```no_run
    /// use platformkit_limit::{Limiter, Postgres};
    ///
    /// # async fn demo() -> Result<(), platformkit_limit::Error> {
    /// let config: tokio_postgres::Config = "host=localhost user=app dbname=app".parse().unwrap();
    /// // Or the service's pool: sqlx's `PgPool`, deadpool's, bb8's.
    /// let store = Postgres::new(config);
    /// store.migrate().await?;
    /// let limiter = Limiter::new(store);
    /// # let _ = limiter;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Connect`] when no connection could be had;
    /// [`ErrorKind::Query`] when PostgreSQL refused the script (a role that
    /// may not create the schema, or that does not own the one there).
    pub async fn migrate(&self) -> Result<(), Error> {
        let operation = Operation::Migrate;
        let mut conn = self
            .conns
            .conn()
            .await
            .map_err(|e| crate::driver::connect_error(operation, e.into()))?;
        crate::driver::sealed::Sealed::script(&mut conn, sql::SCHEMA)
            .await
            .map_err(|failure| failure.into_error(operation, false))
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

    /// A connection for one call. A source that fails is a failure heard
    /// from the server unless the server answered its refusal; a pool that
    /// gave up waiting for one of its connections is a wait, read as any
    /// call's budget running out (see [`Health`]).
    async fn connection(
        &self,
        operation: Operation,
        since: Instant,
        progress: &Progress,
    ) -> Result<C::Conn, Error> {
        progress.reached(Phase::Connecting);
        self.conns.conn().await.map_err(|e| {
            let source = e.into();
            if crate::driver::waited_for_pool(&*source) {
                let waited = Instant::now().saturating_duration_since(since);
                return Error::out_of_budget(
                    operation,
                    waited,
                    self.down(since, Phase::Connecting),
                );
            }
            let error = crate::driver::connect_error(operation, source);
            if error.answered() {
                self.health.answered();
            } else {
                self.health.failed();
            }
            error
        })
    }

    /// A connection for one call and the budget left on it, unless the
    /// connection came too late to send a statement and hear back within
    /// the budget: then nothing is sent, and the
    /// call ran out of budget waiting for the connection.
    async fn session(
        &self,
        operation: Operation,
        since: Instant,
        deadline: Instant,
        progress: &Progress,
    ) -> Result<(C::Conn, Budget), Error> {
        let conn = self.connection(operation, since, progress).await?;
        let rtt = self.health.round_trip();
        let left = deadline.saturating_duration_since(Instant::now());
        // The split counts at most a quarter of what is left: a measure too
        // long for the link cannot starve a call of the time to send. But a
        // statement that cannot come back in what is left is not sent.
        let budget = Budget::until(deadline, rtt.min(left / 4));
        if left < rtt + sql::LEAST_SERVER || Instant::now() >= budget.send_by {
            let waited = Instant::now().saturating_duration_since(since);
            return Err(Error::out_of_budget(
                operation,
                waited,
                self.down(since, Phase::Connecting),
            ));
        }
        Ok((conn, budget))
    }

    /// Whether the server is down, for a call that began at `since` and ran
    /// out of budget at `phase`: its statement sent and unanswered, or
    /// waiting for a connection from a source that was opening one, is
    /// evidence of its own (see [`Health`]).
    fn down(&self, since: Instant, phase: Phase) -> bool {
        let own = match phase {
            Phase::Queued => false,
            Phase::Connecting => self.conns.saturated() == Some(false),
            Phase::Sent => true,
        };
        self.health.down_since(since, own)
    }

    /// Runs `work` (a connection, then one statement through [`call`]) until
    /// `deadline`. A budget that runs out with this call's statement sent
    /// and unanswered is a statement with no answer at all; either way, the
    /// store's health says whether the server was down or busy.
    async fn within<T>(
        &self,
        operation: Operation,
        deadline: Instant,
        since: Instant,
        progress: &Progress,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match timeout_at(deadline, work).await {
            Ok(result) => result,
            Err(_) => {
                let phase = progress.phase();
                if phase == Phase::Sent {
                    self.health.failed();
                }
                let budget = deadline.saturating_duration_since(since);
                let budget =
                    Duration::from_millis(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX));
                Err(Error::out_of_budget(
                    operation,
                    budget,
                    self.down(since, phase),
                ))
            }
        }
    }
}

impl<C: LimitConn> Postgres<C> {
    /// Sends one statement through [`call`], and notes what the server did:
    /// an answer (a row, or an error with a SQLSTATE), or a failure.
    async fn call<S: Session, const N: usize>(
        &self,
        session: &mut S,
        operation: Operation,
        statement: Statement<'_, N>,
        budget: Budget,
        progress: &Progress,
    ) -> Result<Row, Error> {
        let sent = Instant::now();
        let answer = send(session, operation, statement, budget, progress).await;
        match &answer {
            Ok(_) => {
                self.health.answered();
                self.health.took(sent.elapsed());
            }
            // An error the server answered says it is up; its time says
            // nothing of the link (a lock wait, a cancel), except for a
            // statement that did its work and was answered after this
            // call's cancel, whose time keeps the measure from staying
            // above what the link gives.
            Err(e) if e.answered() => {
                self.health.answered();
                if e.answered_after_cancel() {
                    self.health.took(sent.elapsed());
                }
            }
            Err(_) => self.health.failed(),
        }
        answer
    }
}

impl<C: LimitConn> Store for Postgres<C> {}

impl<C: LimitConn> sealed::Sealed for Postgres<C> {
    fn local_now(&self) -> SystemTime {
        self.clock.local_now()
    }

    fn down_since(&self, since: Instant, phase: Phase) -> bool {
        self.down(since, phase)
    }

    async fn count(
        &self,
        op: Op,
        limit: &Limit,
        key: &str,
        n: u64,
        deadline: Instant,
        progress: &Progress,
    ) -> Result<Counted, Error> {
        let operation = Operation::from(op);
        // A pinned clock out of bounds is refused before a connection is taken.
        let pinned = self.pinned()?;
        let window = i64::try_from(limit.window_secs()).expect("windows are at most 366 days");
        let previous = limit.strategy() == Strategy::Sliding;
        let max = i64::from(limit.max());
        let lockout = i64::try_from(limit.lockout_secs()).expect("at most a day");
        let since = Instant::now();
        let row = self
            .within(operation, deadline, since, progress, async {
                let (mut conn, budget) = self.session(operation, since, deadline, progress).await?;
                match op {
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
                        self.call(&mut conn, operation, read.statement(), budget, progress)
                            .await
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
                        self.call(&mut conn, operation, add.statement(), budget, progress)
                            .await
                    }
                }
            })
            .await?;
        let get = |e: Failure| e.into_error(operation, false);
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
        progress: &Progress,
    ) -> Result<Vec<Counted>, Error> {
        let operation = Operation::from(op);
        let pinned = self.pinned()?;
        let keys: Vec<&str> = asked.iter().map(|pair| pair.key).collect();
        let windows: Vec<i64> = asked
            .iter()
            .map(|pair| i64::try_from(pair.limit.window_secs()).expect("at most 366 days"))
            .collect();
        let previous = asked
            .iter()
            .any(|pair| pair.limit.strategy() == Strategy::Sliding);
        let maxes: Vec<i64> = asked.iter().map(|p| i64::from(p.limit.max())).collect();
        let lockouts: Vec<i64> = asked
            .iter()
            .map(|p| i64::try_from(p.limit.lockout_secs()).expect("at most a day"))
            .collect();
        let adds: Vec<i64> = if op.adds() {
            asked
                .iter()
                .map(|pair| i64::try_from(pair.n).unwrap_or(i64::MAX))
                .collect()
        } else {
            Vec::new()
        };
        let since = Instant::now();
        let row = self
            .within(operation, deadline, since, progress, async {
                let (mut conn, budget) = self.session(operation, since, deadline, progress).await?;
                match op {
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
                        self.call(&mut conn, operation, read.statement(), budget, progress)
                            .await
                    }
                    Op::Failed | Op::Hit | Op::Reserve => {
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
                        self.call(&mut conn, operation, add.statement(), budget, progress)
                            .await
                    }
                }
            })
            .await?;
        let get = |e: Failure| e.into_error(operation, false);
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
        let operation = Operation::TakeBack;
        let since = Instant::now();
        let progress = &Progress::default();
        let row = self
            .within(operation, deadline, since, progress, async {
                let (mut conn, budget) = self.session(operation, since, deadline, progress).await?;
                let take_back = sql::TakeBack {
                    key,
                    window_start,
                    n: i64::try_from(n).unwrap_or(i64::MAX),
                    budget_ms: budget.server_ms,
                    relaxed: self.relaxed,
                };
                self.call(
                    &mut conn,
                    operation,
                    take_back.statement(),
                    budget,
                    progress,
                )
                .await
            })
            .await?;
        deleted(&row, Operation::TakeBack)
    }

    async fn refused(
        &self,
        limit: &Limit,
        prefix: &str,
        at_most: usize,
        deadline: Instant,
    ) -> Result<Vec<(String, Counted)>, Error> {
        let operation = Operation::RefusedKeys;
        let pinned = self.pinned()?;
        let since = Instant::now();
        let progress = &Progress::default();
        let row = self
            .within(operation, deadline, since, progress, async {
                let (mut conn, budget) = self.session(operation, since, deadline, progress).await?;
                let list = sql::List {
                    prefix,
                    window_secs: i64::try_from(limit.window_secs()).expect("at most 366 days"),
                    at: pinned,
                    budget_ms: budget.server_ms,
                    previous: limit.strategy() == Strategy::Sliding,
                    max: i64::from(limit.max()),
                    lockout_secs: i64::try_from(limit.lockout_secs()).expect("at most a day"),
                    at_most: i64::try_from(at_most).unwrap_or(i64::MAX),
                };
                self.call(&mut conn, operation, list.statement(), budget, progress)
                    .await
            })
            .await?;
        let get = |e: Failure| e.into_error(operation, false);
        let keys: Vec<String> = row.get(0).map_err(get)?;
        let counts: Vec<i64> = row.get(1).map_err(get)?;
        let window_end: SystemTime = row.get(2).map_err(get)?;
        let now: SystemTime = row.get(3).map_err(get)?;
        let previous: Vec<i64> = row.get(4).map_err(get)?;
        let locked_until: Vec<Option<SystemTime>> = row.get(5).map_err(get)?;
        ensure!(
            [counts.len(), previous.len(), locked_until.len()]
                .iter()
                .all(|&n| n == keys.len())
                && keys.len() <= at_most,
            UnexpectedSnafu {
                operation,
                what: "a listing whose columns disagree, or longer than asked",
            }
        );
        Ok(keys
            .into_iter()
            .zip(counts)
            .zip(previous)
            .zip(locked_until)
            .map(|(((key, count), previous), locked_until)| {
                let counted = Counted {
                    count: stored_count(count),
                    previous: stored_count(previous),
                    locked_until,
                    window_end,
                    now,
                };
                (key, counted)
            })
            .collect())
    }

    async fn reset(&self, key: &str, deadline: Instant) -> Result<u64, Error> {
        let operation = Operation::Reset;
        let since = Instant::now();
        let progress = &Progress::default();
        let row = self
            .within(operation, deadline, since, progress, async {
                let (mut conn, budget) = self.session(operation, since, deadline, progress).await?;
                let reset = sql::Reset {
                    key,
                    budget_ms: budget.server_ms,
                    relaxed: self.relaxed,
                };
                self.call(&mut conn, operation, reset.statement(), budget, progress)
                    .await
            })
            .await?;
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
    send(session, operation, statement, budget, &Progress::default()).await
}

/// As [`call`], noting in `progress` when the statement is on its way.
async fn send<S: Session, const N: usize>(
    session: &mut S,
    operation: Operation,
    statement: Statement<'_, N>,
    budget: Budget,
    progress: &Progress,
) -> Result<Row, Error> {
    crate::metric::statement_sent(operation);
    progress.reached(Phase::Sent);
    let (answer, cancelled) = session
        .send(statement.sql, &statement.params, budget.cancel_at)
        .await;
    let cancel_sent = cancelled.is_some();
    if let Some(delivered) = cancelled
        && !cancelled_by_it(&answer)
    {
        // The statement was answered before its cancel reached the server:
        // keep the connection until the cancel has landed, on an idle
        // backend, which ignores it, and not on the next statement.
        let landed = budget
            .cancel_lands
            .max(delivered + budget.rtt / 2 + sql::CANCEL_LANDS);
        tokio::time::sleep_until(landed).await;
    }
    match answer {
        Ok(_) if cancel_sent => AnsweredAfterCancelSnafu { operation }
            .fail()
            .map_err(Error::from),
        Ok(row) => Ok(row),
        Err(e) => {
            let error = e.into_error(operation, cancel_sent);
            if error.kind() == ErrorKind::InTransaction {
                // Best effort: the error says what happened either way.
                session.rollback().await;
            }
            Err(error)
        }
    }
}

/// Whether `answer` is the statement stopped by a cancel (57014).
fn cancelled_by_it(answer: &Result<Row, crate::driver::Failure>) -> bool {
    match answer {
        Ok(_) => false,
        Err(failure) => matches!(
            failure.reading(),
            crate::error::Reading::Answered(code) if code == tokio_postgres::error::SqlState::QUERY_CANCELED
        ),
    }
}

/// Reads the one count column of a reset, purge or take-back.
pub(crate) fn deleted(row: &Row, operation: Operation) -> Result<u64, Error> {
    let deleted: i64 = row.get(0).map_err(|e| e.into_error(operation, false))?;
    Ok(u64::try_from(deleted).unwrap_or(0))
}
