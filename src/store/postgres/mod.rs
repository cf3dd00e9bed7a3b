//! [`Postgres`]: the real store. A limit is a row.
//!
//! - `mod.rs`: the type, `migrate`, and the envelope of each call: the
//!   connection, the budget left on it, what the server was heard to do;
//! - `counts.rs`: the store's calls, each a statement of
//!   [`sql`] and its row read into counts.

mod counts;

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use snafu::ensure;

use crate::clock::Clock;
use crate::driver::{Row, Session};
use crate::error::InvalidOptionSnafu;
use crate::operation::Operation;
use crate::store::Store;
use crate::store::budget::{self, Budget};
use crate::store::health::{Health, Startup};
use crate::store::sql::{self, Statement};
use crate::store::statement::call;
use crate::{Error, LimitConn, ManualClock};

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
    /// What this store knows of the server: down, and the round trip.
    health: Health,
    /// The probe given to the store, in place of the source's own.
    probe: Option<Probe>,
}

/// A probe given to the store: a connection source's, boxed.
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

    /// Probes the server through `source` (its
    /// [`LimitConn::probe`]) instead of the connection source's own: for a
    /// source that lends a held connection and cannot open one of its own,
    /// which is otherwise never read as down (every call that got no
    /// answer is shed).
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
    /// no budget: run it before serving. Replicas starting at once take
    /// turns on one advisory lock, waited for at most
    /// `platformkit.migrate_lock_wait` (a setting of the session, 30 s when
    /// unset): any login may take that lock, and one that holds it makes
    /// `migrate` fail with `PK005`, naming it, never hang.
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
    /// [`ErrorKind::Connect`](crate::ErrorKind::Connect) when no connection could be had;
    /// [`ErrorKind::Query`](crate::ErrorKind::Query) when PostgreSQL refused the script: a role that
    /// may not create the schema, or that does not own the one there; or a
    /// database whose schema is newer than this crate's
    /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION) (SQLSTATE `PK002`), left as
    /// it is, so that a replica of the release before, starting during a
    /// rolling deploy, cannot put its routines back over the newer ones; or
    /// the schema's lock held past its bound (`PK005`, naming the session).
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

    /// The pinned time in microseconds since the Unix epoch, if the clock
    /// is pinned: within the years the procedures accept (1900 to 2199).
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

    /// A connection for one call.
    async fn connection(&self, operation: Operation) -> Result<C::Conn, Error> {
        self.conns
            .conn()
            .await
            .map_err(|e| crate::driver::connect_error(operation, e.into()))
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
    ) -> Result<(C::Conn, Budget), Error> {
        let conn = self.connection(operation).await?;
        let rtt = self.health.round_trip();
        let left = deadline.saturating_duration_since(Instant::now());
        // The split counts at most a quarter of what is left: a measure too
        // long for the link cannot starve a call of the time to send. But a
        // statement that cannot come back in what is left is not sent.
        let budget = Budget::until(deadline, rtt.min(left / 4));
        if left < rtt + budget::LEAST_SERVER || Instant::now() >= budget.send_by {
            let waited = Instant::now().saturating_duration_since(since);
            return Err(Error::out_of_budget(operation, waited));
        }
        Ok((conn, budget))
    }

    /// Runs `work` (a connection, then one statement through
    /// [`call`]) until `deadline`.
    async fn within<T>(
        &self,
        operation: Operation,
        deadline: Instant,
        since: Instant,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        timeout_at(deadline, work).await.unwrap_or_else(|_| {
            let budget = deadline.saturating_duration_since(since);
            let budget =
                Duration::from_millis(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX));
            Err(Error::out_of_budget(operation, budget))
        })
    }

    /// Asks the server, as [`LimitConn::probe`] does: through the probe
    /// given to the store, else the connection source's own.
    async fn ask_server(&self) -> Startup {
        match &self.probe {
            Some(Probe(probe)) => probe().await,
            None => self.conns.probe().await,
        }
    }

    /// Sends one statement through [`call`],
    /// and notes how long an answered one took.
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
            // An error's time says nothing of the link (a lock wait, a
            // cancel), except for a statement that did its work and was
            // answered after this call's cancel, whose time keeps the
            // measure from staying above what the link gives.
            Err(e) if e.answered_after_cancel() => self.health.took(sent.elapsed()),
            Err(_) => {}
        }
        answer
    }
}

impl<C: LimitConn> Store for Postgres<C> {}
