//! [`Postgres`], the real store: [`call`], the one place a statement is
//! sent, within its [`Budget`], and [`Health`], what it knows of its server.
//! `counts.rs` holds the calls, each a statement of [`sql`].

mod counts;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use snafu::ensure;
use tokio::sync::Notify;
use tokio::time::{Instant, timeout_at};

use crate::clock::Clock;
use crate::driver::{Row, Session};
use crate::error::{AnsweredAfterCancelSnafu, BoxError, InvalidOptionSnafu};
use crate::metric::Operation;
use crate::store::Store;
use crate::store::sql::{self, Statement};
use crate::{Error, ErrorKind, LimitConn, ManualClock};

/// The real store: each key's count in each window is a row of
/// `platformkit_limits`, shared by every replica and kept across deploys.
/// Each call borrows one connection from the caller's [`LimitConn`] and
/// sends one statement ([one call's path](crate::guide#one-calls-path)).
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
    /// What this store knows of the server: down, and the round trip.
    health: Health,
    /// The probe given to the store, in place of the source's own.
    probe: Option<Probe>,
}

struct Probe(Box<dyn Fn() -> futures::future::BoxFuture<'static, Startup> + Send + Sync>);

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

impl<C: LimitConn> Postgres<C> {
    /// A store that borrows its connections from `conns` for each call.
    pub fn new(conns: C) -> Self {
        Postgres {
            conns,
            clock: Clock::Store,
            relaxed: false,
            health: Health::default(),
            probe: None,
        }
    }

    /// Probes the server through `source`'s [`LimitConn::probe`]: for a
    /// source that lends a held connection, which otherwise is never read
    /// as down ([down or overloaded](crate::guide#down-or-overloaded)).
    ///
    /// ```no_run
    /// use platformkit_limit::Postgres;
    /// use std::sync::Arc;
    /// use tokio::sync::Mutex;
    ///
    /// # fn demo(client: tokio_postgres::Client) {
    /// let held = Arc::new(Mutex::new(client));
    /// let config: tokio_postgres::Config = "host=db user=app dbname=app".parse().unwrap();
    /// let store = Postgres::new(move || {
    ///     let held = held.clone();
    ///     async move { Ok::<_, std::convert::Infallible>(held.lock_owned().await) }
    /// })
    /// .with_probe(config);
    /// # let _ = store;
    /// # }
    /// ```
    pub fn with_probe<P: LimitConn>(mut self, source: P) -> Self {
        let source = std::sync::Arc::new(source);
        self.probe = Some(Probe(Box::new(move || {
            let source = source.clone();
            Box::pin(async move { source.probe().await })
        })));
        self
    }

    /// Reads the time from `clock` instead of the database: for tests that
    /// pin the time. Every replica must then share the clock.
    pub fn with_clock(mut self, clock: ManualClock) -> Self {
        self.clock = Clock::Manual(clock);
        self
    }

    /// Commits the limiter's transactions without waiting for their WAL
    /// flush (`synchronous_commit = off` for those alone). The default is
    /// durable. What it can lose: when the **server crashes**, the calls
    /// acknowledged in at most three times `wal_writer_delay` before it come
    /// back uncounted. Nothing is corrupted, no other transaction is
    /// affected, and a crash of the limiter's process loses nothing.
    pub fn with_relaxed_durability(mut self) -> Self {
        self.relaxed = true;
        self
    }

    /// The connection source.
    pub fn conns(&self) -> &C {
        &self.conns
    }

    /// Applies [`SCHEMA`](crate::SCHEMA) through one connection of the
    /// source: the start-up step, safe to run again, by every replica at
    /// once. The role that runs it owns the schema; another role needs
    /// [`grants`](crate::grants). It has no budget: run it before serving.
    /// Replicas take turns on one advisory lock, waited for at most
    /// `platformkit.migrate_lock_wait` (30 s when unset), then `PK005`.
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
    /// [`ErrorKind::Query`] when PostgreSQL refused the script: a role that
    /// may not create the schema or does not own it; a schema newer than
    /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION) (`PK002`, left as it is,
    /// so an older replica cannot roll it back); or the lock held past its
    /// bound (`PK005`, naming the session).
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

    /// The pinned time in epoch microseconds, if pinned, within
    /// [`sql::PINNED_MICROS`].
    fn pinned(&self) -> Result<Option<i64>, Error> {
        let Some(pinned) = self.clock.pinned() else {
            return Ok(None);
        };
        let micros = crate::clock::micros_since_epoch(pinned);
        ensure!(
            sql::PINNED_MICROS.contains(&micros),
            InvalidOptionSnafu {
                option: "clock",
                reason: "a pinned clock must be within the years 1900 to 2199",
            }
        );
        Ok(Some(micros))
    }

    async fn connection(&self, operation: Operation) -> Result<C::Conn, Error> {
        self.conns
            .conn()
            .await
            .map_err(|e| crate::driver::connect_error(operation, e.into()))
    }

    /// A connection for one call and the [`budget`](Self::budget) left on it.
    async fn session(
        &self,
        operation: Operation,
        since: Instant,
        deadline: Instant,
    ) -> Result<(C::Conn, Budget), Error> {
        let conn = self.connection(operation).await?;
        Ok((conn, self.budget(operation, since, deadline)?))
    }

    /// The budget left for a statement sent now; out of budget when it is
    /// too late to send one and hear back.
    fn budget(
        &self,
        operation: Operation,
        since: Instant,
        deadline: Instant,
    ) -> Result<Budget, Error> {
        let rtt = self.health.round_trip();
        let left = deadline.saturating_duration_since(Instant::now());
        // At most a quarter of what is left: a measure too long cannot
        // starve the call.
        let budget = Budget::until(deadline, rtt.min(left / 4));
        if left < rtt + LEAST_SERVER || Instant::now() >= budget.send_by {
            let waited = Instant::now().saturating_duration_since(since);
            return Err(Error::out_of_budget(operation, waited));
        }
        Ok(budget)
    }

    /// Sends the statement `statement` makes for the server's share of the
    /// budget, on a connection of its own, finished by `deadline`.
    async fn send<'a, const N: usize>(
        &self,
        operation: Operation,
        deadline: Instant,
        statement: impl FnOnce(i64) -> Statement<'a, N>,
    ) -> Result<Row, Error> {
        self.send_on(&mut None, operation, deadline, statement)
            .await
    }

    /// As [`send`](Self::send), on the connection `held` if any, and
    /// leaves the connection there if it answered: a flight's next
    /// statement goes on it.
    async fn send_on<'a, const N: usize>(
        &self,
        held: &mut Option<C::Conn>,
        operation: Operation,
        deadline: Instant,
        statement: impl FnOnce(i64) -> Statement<'a, N>,
    ) -> Result<Row, Error> {
        let since = Instant::now();
        let work = async {
            let (mut conn, budget) = match held.take() {
                Some(conn) => (conn, self.budget(operation, since, deadline)?),
                None => self.session(operation, since, deadline).await?,
            };
            let answer = self
                .call(&mut conn, operation, statement(budget.server_ms), budget)
                .await;
            if answer.is_ok() {
                *held = Some(conn);
            }
            answer
        };
        timeout_at(deadline, work).await.unwrap_or_else(|_| {
            let budget = deadline.saturating_duration_since(since);
            let budget =
                Duration::from_millis(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX));
            Err(Error::out_of_budget(operation, budget))
        })
    }

    /// Probes through the store's probe, else the connection source's.
    async fn ask_server(&self) -> Startup {
        match &self.probe {
            Some(Probe(probe)) => probe().await,
            None => self.conns.probe().await,
        }
    }

    /// Sends one statement through [`call`], noting how long it took.
    async fn call<S: Session, const N: usize>(
        &self,
        session: &mut S,
        operation: Operation,
        statement: Statement<'_, N>,
        budget: Budget,
    ) -> Result<Row, Error> {
        let sent = Instant::now();
        let answer = call(session, operation, statement, budget).await;
        match &answer {
            Ok(_) => self.health.took(sent.elapsed()),
            // An error's time says nothing of the link, except an answer
            // after this call's cancel, which keeps the measure from sticking.
            Err(e) if e.answered_after_cancel() => self.health.took(sent.elapsed()),
            Err(_) => {}
        }
        answer
    }
}

impl<C: LimitConn> Store for Postgres<C> {}

/// Sends one statement on `session` and returns its one row, within
/// [`Budget`] ([the budget on the server](crate::guide#the-budget-on-the-server)).
pub(crate) async fn call<S: Session, const N: usize>(
    session: &mut S,
    operation: Operation,
    statement: Statement<'_, N>,
    budget: Budget,
) -> Result<Row, Error> {
    crate::metric::statement_sent(operation);
    let (answer, cancelled) = session
        .send(statement.sql, &statement.params, budget.cancel_at)
        .await;
    let cancel_sent = cancelled.is_some();
    if let Some(delivered) = cancelled
        && !cancelled_by_it(&answer)
    {
        // Answered before its cancel landed: hold the connection until it
        // lands on an idle backend, not on the next statement.
        let landed = budget
            .cancel_lands
            .max(delivered + budget.rtt / 2 + CANCEL_LANDS);
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
            crate::error::Reading::Answered(code) if *code == tokio_postgres::error::SqlState::QUERY_CANCELED
        ),
    }
}

/// Reads the one count column of a reset, purge or take-back.
pub(crate) fn deleted(row: &Row, operation: Operation) -> Result<u64, Error> {
    let deleted: i64 = row.int8(0).map_err(|e| e.into_error(operation, false))?;
    Ok(u64::try_from(deleted).unwrap_or(0))
}

/// How a call's budget is split between the server and the client
/// ([the budget on the server](crate::guide#the-budget-on-the-server)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// The server's part, in whole milliseconds (at least 1).
    pub(crate) server_ms: i64,
    pub(crate) cancel_at: Instant,
    /// The last moment a statement may be sent.
    pub(crate) send_by: Instant,
    /// About the link's round trip, as the split counted it.
    pub(crate) rtt: Duration,
    /// When a cancel request sent at `cancel_at` has surely landed, so it
    /// can no longer reach a later statement on the connection.
    pub(crate) cancel_lands: Instant,
}

/// The most a cancel request is sent ahead of the deadline.
const CANCEL_AHEAD: Duration = Duration::from_millis(100);

/// The least a statement is sent with beyond the round trip: less, and it
/// could only run out of budget on its way.
pub(crate) const LEAST_SERVER: Duration = Duration::from_millis(2);

/// What a server takes, beyond the round trips, to act on a cancel request:
/// its new connection's start.
pub(crate) const CANCEL_LANDS: Duration = Duration::from_millis(2);

impl Budget {
    pub(crate) fn until(deadline: Instant, rtt: Duration) -> Budget {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        let ahead = CANCEL_AHEAD.min(left / 10);
        let server = left.saturating_sub(rtt + ahead * 2);
        let cancel_at = deadline
            .checked_sub(ahead + rtt * 2)
            .map_or(now, |at| at.max(now));
        Budget {
            server_ms: i64::try_from(server.as_millis().max(1)).unwrap_or(i64::MAX),
            cancel_at,
            send_by: deadline.checked_sub(ahead + rtt).unwrap_or(now),
            cancel_lands: (cancel_at + rtt * 2 + CANCEL_LANDS).min(deadline),
            rtt,
        }
    }
}

/// How long a probe's answer stands for every call of the store.
pub(crate) const STANDS: Duration = Duration::from_secs(1);

/// How long a probe waits for an answer before it reads the server as down.
pub(crate) const PROBE_BOUND: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Health {
    base: Instant,
    probe: Mutex<Probed>,
    /// Whether the latest probe found the server down: read without the
    /// lock, so calls to a server that is up never take it.
    down: AtomicBool,
    /// Woken when a probe in flight is answered (or dropped).
    answered: Notify,
    /// About the link's round trip: the shortest answered statement of the
    /// last two windows of [`RTT_WINDOW`], which slow ones cannot raise.
    rtt: Mutex<Shortest>,
}

/// The latest probe's answer, and whether one is in flight.
#[derive(Debug, Default)]
struct Probed {
    /// When the latest probe was answered, and whether it found it down.
    latest: Option<(Instant, bool)>,
    asking: bool,
}

/// How long a shortest round trip is kept: two windows of this.
const RTT_WINDOW: Duration = Duration::from_secs(10);

/// The shortest statement of the current window and of the one before.
#[derive(Debug, Default)]
struct Shortest {
    window: u64,
    current: Option<Duration>,
    previous: Option<Duration>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            base: Instant::now(),
            probe: Mutex::default(),
            down: AtomicBool::new(false),
            answered: Notify::new(),
            rtt: Mutex::default(),
        }
    }
}

/// What a call does before it tries the server.
enum Before {
    Go,
    /// Found down and still standing, or another call asks: answer at once.
    Down,
    /// The latest probe found the server down and has aged: ask again.
    Ask,
}

impl Health {
    /// Whether the server is down for a call about to try it; a call that
    /// finds an aged "down" probes.
    pub(crate) async fn down_before(&self, ask: impl Future<Output = Startup>) -> bool {
        if !self.down.load(Ordering::Relaxed) {
            return false;
        }
        let before = {
            let probed = self.probed();
            match probed.latest {
                None | Some((_, false)) => Before::Go,
                Some((at, true)) if at.elapsed() < STANDS || probed.asking => Before::Down,
                Some(_) => Before::Ask,
            }
        };
        match before {
            Before::Go => false,
            Before::Down => true,
            Before::Ask => self.down(ask).await,
        }
    }

    /// Whether the server is down, for a call that got no answer: the
    /// latest probe's answer if it stands, else the answer of `ask` or of
    /// the probe already in flight (then `ask` is dropped unpolled).
    pub(crate) async fn down(&self, ask: impl Future<Output = Startup>) -> bool {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let mine = {
                let mut probed = self.probed();
                match probed.latest {
                    Some((at, down)) if at.elapsed() < STANDS => return down,
                    _ if probed.asking => false,
                    _ => {
                        probed.asking = true;
                        true
                    }
                }
            };
            if mine {
                let asking = Asking(self);
                let down = read(tokio::time::timeout(PROBE_BOUND, ask).await);
                asking.answered(down);
                return down;
            }
            answered.await;
        }
    }

    fn probed(&self) -> std::sync::MutexGuard<'_, Probed> {
        self.probe.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An answered statement took `took`, from sending to its answer.
    pub(crate) fn took(&self, took: Duration) {
        let window = self.window_now();
        let mut rtt = self.rtt.lock().unwrap_or_else(PoisonError::into_inner);
        rtt.roll(window);
        rtt.current = Some(rtt.current.map_or(took, |shortest| shortest.min(took)));
    }

    /// About the link's round trip (zero when nothing was measured lately).
    pub(crate) fn round_trip(&self) -> Duration {
        let window = self.window_now();
        let mut rtt = self.rtt.lock().unwrap_or_else(PoisonError::into_inner);
        rtt.roll(window);
        match (rtt.current, rtt.previous) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or_default(),
        }
    }

    fn window_now(&self) -> u64 {
        let since = Instant::now().saturating_duration_since(self.base);
        u64::try_from(since.as_nanos() / RTT_WINDOW.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What a probe heard: `None` from a source that cannot probe; else a
/// completed startup, or the driver's error.
pub(crate) type Startup = Option<Result<(), BoxError>>;

/// Whether a probe's answer (`Err`: none within [`PROBE_BOUND`]) is a
/// server that is down. A source that cannot probe is never read as down.
fn read(heard: Result<Startup, tokio::time::error::Elapsed>) -> bool {
    let down = match heard {
        Err(_) => true,
        Ok(None | Some(Ok(()))) => false,
        Ok(Some(Err(error))) => !crate::driver::server_answered(&*error),
    };
    crate::metric::probed(down);
    down
}

/// A probe in flight: whoever waits is woken, even if its call is dropped.
struct Asking<'a>(&'a Health);

impl Asking<'_> {
    fn answered(self, down: bool) {
        self.0.probed().latest = Some((Instant::now(), down));
        self.0.down.store(down, Ordering::Relaxed);
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.probed().asking = false;
        self.0.answered.notify_waiters();
    }
}

impl Shortest {
    /// Moves on to `window`, forgetting what is older than the one before.
    fn roll(&mut self, window: u64) {
        if window == self.window {
            return;
        }
        self.previous = if window == self.window + 1 {
            self.current
        } else {
            None
        };
        self.current = None;
        self.window = window;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A probe that counts its askers and answers `heard` after `takes`.
    async fn asked(count: &AtomicUsize, takes: Duration, heard: Startup) -> Startup {
        count.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(takes).await;
        heard
    }

    fn refused() -> Startup {
        Some(Err(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )
        .into()))
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_at_a_time_answers_every_call_and_its_answer_stands_a_while() {
        let health = Health::default();
        let count = AtomicUsize::new(0);
        let calls =
            (0..1000).map(|_| health.down(asked(&count, Duration::from_millis(5), Some(Ok(())))));
        let answers = futures::future::join_all(calls).await;
        assert!(
            answers.iter().all(|down| !down),
            "an answered startup is up"
        );
        assert_eq!(
            count.load(Ordering::Relaxed),
            1,
            "one probe for 1,000 calls"
        );

        tokio::time::advance(STANDS / 2).await;
        assert!(!health.down(asked(&count, Duration::ZERO, refused())).await);
        assert_eq!(count.load(Ordering::Relaxed), 1, "the answer stands");

        tokio::time::advance(STANDS).await;
        assert!(health.down(asked(&count, Duration::ZERO, refused())).await);
        assert_eq!(count.load(Ordering::Relaxed), 2, "aged: asked again");
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_within_the_bound_is_down_and_a_source_that_cannot_probe_is_never() {
        let health = Health::default();
        let count = AtomicUsize::new(0);
        assert!(
            health
                .down(asked(&count, PROBE_BOUND * 2, Some(Ok(()))))
                .await,
            "no answer within the bound"
        );
        tokio::time::advance(STANDS).await;
        assert!(!health.down(asked(&count, Duration::ZERO, None)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn while_down_calls_are_answered_at_once_and_one_probe_per_interval_looks_for_the_way_back()
     {
        let health = Health::default();
        let count = AtomicUsize::new(0);
        assert!(
            !health
                .down_before(asked(&count, Duration::ZERO, refused()))
                .await
        );
        assert_eq!(count.load(Ordering::Relaxed), 0, "nothing heard: go");

        assert!(health.down(asked(&count, Duration::ZERO, refused())).await);
        for _ in 0..100 {
            assert!(
                health
                    .down_before(asked(&count, Duration::ZERO, Some(Ok(()))))
                    .await
            );
        }
        assert_eq!(count.load(Ordering::Relaxed), 1, "answered at once");

        tokio::time::advance(STANDS).await;
        assert!(
            !health
                .down_before(asked(&count, Duration::ZERO, Some(Ok(()))))
                .await,
            "aged: the call that finds it asks, and the first answer ends it"
        );
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_mid_flight_lets_the_next_call_ask() {
        let health = Health::default();
        let count = AtomicUsize::new(0);
        let dropped = tokio::time::timeout(
            Duration::from_millis(1),
            health.down(asked(&count, Duration::from_secs(5), Some(Ok(())))),
        )
        .await;
        assert!(dropped.is_err());
        assert!(
            !health
                .down(asked(&count, Duration::ZERO, Some(Ok(()))))
                .await
        );
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_round_trip_is_the_shortest_recent_statement_and_slow_ones_do_not_raise_it() {
        let health = Health::default();
        assert_eq!(health.round_trip(), Duration::ZERO, "nothing measured yet");
        health.took(Duration::from_millis(5));
        for _ in 0..100 {
            // A flood of statements that waited on a lock.
            health.took(Duration::from_millis(400));
        }
        assert_eq!(health.round_trip(), Duration::from_millis(5));
        tokio::time::advance(RTT_WINDOW).await;
        health.took(Duration::from_millis(400));
        assert_eq!(
            health.round_trip(),
            Duration::from_millis(5),
            "kept for the window after"
        );
        tokio::time::advance(RTT_WINDOW).await;
        assert_eq!(
            health.round_trip(),
            Duration::from_millis(400),
            "then forgotten"
        );
        tokio::time::advance(RTT_WINDOW * 2).await;
        assert_eq!(health.round_trip(), Duration::ZERO, "nothing recent");
    }
}
