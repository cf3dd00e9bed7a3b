//! [`Postgres`]: the real store. A limit is a row.

use std::time::{Duration, SystemTime};

use futures::future::join3;
use postgres_types::{ToSql, Type};
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::clock::Clock;
use crate::sql::{self, Durability};
use crate::store::{Counted, Op, Store, sealed};
use crate::{Error, Limit, LimitConn, ManualClock};

/// The real store: each key's count in each window is a row of
/// `platformkit_limits`, shared by every replica and kept across deploys.
///
/// Each call borrows one connection from the caller's [`LimitConn`] and runs
/// one statement inside the limiter's own short system transaction, sent
/// pipelined: one network round trip on an idle connection. Keys travel only
/// as bind parameters. The window comes from the database's clock.
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
    durability: Durability,
}

impl<C: LimitConn> Postgres<C> {
    /// A store that borrows its connections from `conns` for each call.
    pub fn new(conns: C) -> Self {
        Postgres {
            conns,
            clock: Clock::Store,
            durability: Durability::Durable,
        }
    }

    /// Reads the time from `clock` instead of the database: for tests that
    /// pin the time. Every replica must then share the clock.
    pub fn with_clock(mut self, clock: ManualClock) -> Self {
        self.clock = Clock::Manual(clock);
        self
    }

    /// The connection source.
    pub fn conns(&self) -> &C {
        &self.conns
    }

    async fn connection(&self, operation: &'static str) -> Result<C::Conn, Error> {
        self.conns
            .conn()
            .await
            .map_err(|e| Error::connect(operation, e.into()))
    }
}

impl<C: LimitConn> Store for Postgres<C> {}

impl<C: LimitConn> sealed::Sealed for Postgres<C> {
    async fn count(
        &self,
        op: Op,
        limit: &Limit,
        key: &str,
        deadline: Instant,
    ) -> Result<Counted, Error> {
        let conn = self.connection(op.name()).await?;
        let window = i64::try_from(limit.window_secs()).expect("windows are at most 366 days");
        let pinned: Option<SystemTime> = self.clock.pinned();
        let budget = deadline.saturating_duration_since(Instant::now());
        let row = match op {
            Op::Check => {
                let params: [(&(dyn ToSql + Sync), Type); 3] = [
                    (&key, Type::TEXT),
                    (&window, Type::INT8),
                    (&pinned, Type::TIMESTAMPTZ),
                ];
                system_transaction(&conn, op.name(), budget, self.durability, |c| {
                    c.query_typed_one(sql::READ, &params)
                })
                .await?
            }
            Op::Failed | Op::Hit => {
                let one = 1_i64;
                let params: [(&(dyn ToSql + Sync), Type); 4] = [
                    (&key, Type::TEXT),
                    (&one, Type::INT8),
                    (&window, Type::INT8),
                    (&pinned, Type::TIMESTAMPTZ),
                ];
                system_transaction(&conn, op.name(), budget, self.durability, |c| {
                    c.query_typed_one(sql::ADD, &params)
                })
                .await?
            }
        };
        let count: i64 = row
            .try_get(0)
            .map_err(|e| Error::from_postgres(op.name(), e))?;
        let window_end: SystemTime = row
            .try_get(1)
            .map_err(|e| Error::from_postgres(op.name(), e))?;
        let now: SystemTime = row
            .try_get(2)
            .map_err(|e| Error::from_postgres(op.name(), e))?;
        Ok(Counted {
            // The table's CHECK keeps counts non-negative; were one ever
            // negative, refusing is the safe reading.
            count: u64::try_from(count).unwrap_or(u64::MAX),
            window_end,
            now,
        })
    }

    async fn reset(&self, key: &str, deadline: Instant) -> Result<u64, Error> {
        let conn = self.connection("reset").await?;
        let budget = deadline.saturating_duration_since(Instant::now());
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&key, Type::TEXT)];
        system_transaction(&conn, "reset", budget, self.durability, |c| {
            c.execute_typed(sql::RESET, &params)
        })
        .await
    }
}

/// Runs one statement inside the limiter's own system transaction, pipelined:
/// `BEGIN …` (with the guard and the budget), the statement, and `COMMIT` are
/// all sent before any answer is awaited. See [`sql`](crate::sql).
///
/// All three requests are queued on the connection in the first poll, so a
/// caller that gives up (the budget) cannot leave the connection inside the
/// transaction: the `COMMIT` is already on its way, and the server-side
/// timeouts end a statement the client stopped waiting for.
pub(crate) async fn system_transaction<'c, T, F, Fut>(
    client: &'c Client,
    operation: &'static str,
    budget: Duration,
    durability: Durability,
    statement: F,
) -> Result<T, Error>
where
    F: FnOnce(&'c Client) -> Fut,
    Fut: Future<Output = Result<T, tokio_postgres::Error>>,
{
    let begin = sql::begin(budget, durability);
    let (began, done, committed) = join3(
        client.batch_execute(&begin),
        statement(client),
        client.batch_execute(sql::COMMIT),
    )
    .await;
    began.map_err(|e| Error::from_postgres(operation, e))?;
    let value = done.map_err(|e| Error::from_postgres(operation, e))?;
    committed.map_err(|e| Error::from_postgres(operation, e))?;
    Ok(value)
}
