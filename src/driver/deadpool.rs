//! [`LimitConn`] for [`deadpool_postgres::Pool`] (feature `deadpool`), and,
//! opted into, the same pool with each statement prepared once per
//! connection ([`Prepared`]), with its [`Session`](super::Session).
//!
//! Through [`Prepared`], a statement is prepared once per connection (a
//! named statement in the connection's deadpool statement cache) and each
//! call sends only Bind, Execute and Sync: still one round trip, after the
//! first on each connection, and the server neither parses nor plans it
//! again. A statement still unanswered at the cancel mark is sent a cancel
//! request, as on any tokio-postgres connection.

use std::future::Future;
use std::ops::Deref;

use postgres_types::{ToSql, Type};
use tokio::time::Instant;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::tokio_postgres::{cancelling, failure, typed};
use super::{Failure, Param, Row, sealed};
use crate::LimitConn;
use crate::error::BoxError;

/// A connection borrowed from a [`deadpool_postgres::Pool`] for one call;
/// back in the pool when dropped.
#[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
#[derive(Debug)]
pub struct DeadpoolConn(deadpool_postgres::Object);

impl Deref for DeadpoolConn {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.0
    }
}

/// ```no_run
/// # async fn demo(pool: deadpool_postgres::Pool) {
/// use platformkit_limit::{Limiter, Postgres};
///
/// let limiter = Limiter::new(Postgres::new(pool));
/// # let _ = limiter;
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
impl LimitConn for deadpool_postgres::Pool {
    type Conn = DeadpoolConn;
    type Error = deadpool_postgres::PoolError;

    async fn conn(&self) -> Result<DeadpoolConn, deadpool_postgres::PoolError> {
        self.get().await.map(DeadpoolConn)
    }

    fn probe(&self) -> impl Future<Output = Option<Result<(), BoxError>>> + Send {
        probe(self)
    }
}

/// A connection the pool's manager opens outside the pool and its limits.
async fn probe(pool: &deadpool_postgres::Pool) -> Option<Result<(), BoxError>> {
    use deadpool::managed::Manager as _;
    let started = async {
        let client = pool.manager().create().await?;
        super::tokio_postgres::started(&client).await
    };
    Some(started.await)
}

/// A deadpool pool, or one of its connections, on which the limiter
/// prepares each of its statements once per connection and keeps it in
/// that connection's statement cache (deadpool's `prepare_typed_cached`).
///
/// Without it a statement goes as one unnamed Parse, Bind, Execute and
/// Sync, and the server parses and plans it on every call. Through
/// `Prepared`, the first call on each connection prepares it (one more
/// round trip, once) and every later call sends only Bind, Execute and
/// Sync: still one round trip, and on the server about a quarter of a
/// read's work and a seventh of a write's saved (the figures are in
/// `docs/PERFORMANCE.md`). Results, errors, the budget and the cancel
/// request are the same as without it.
///
/// It is opt-in because named prepared statements must reach the
/// backend that prepared them: through PgBouncer in transaction mode,
/// only version 1.21 or newer with `max_prepared_statements` set passes
/// them on; an older one makes calls fail with a hard error
/// ([`ErrorKind::Query`](crate::ErrorKind::Query)), never count wrong.
/// Should the connection's statements be deallocated behind the cache
/// (`DEALLOCATE ALL`, `DISCARD ALL`; deadpool's own recycling never
/// does), that call fails the same way and the next one prepares the
/// statement again. Each statement a connection has sent stays prepared
/// on its backend for the connection's life.
///
/// ```no_run
/// # async fn demo(pool: deadpool_postgres::Pool) {
/// use platformkit_limit::driver::Prepared;
/// use platformkit_limit::{Limiter, Postgres};
///
/// let limiter = Limiter::new(Postgres::new(Prepared(pool)));
/// # let _ = limiter;
/// # }
/// ```
///
/// A held deadpool connection (anything that derefs to a
/// [`deadpool_postgres::ClientWrapper`], such as a
/// `deadpool_postgres::Object`) is lent the same way, from a closure:
///
/// ```no_run
/// # async fn demo(pool: deadpool_postgres::Pool) {
/// use platformkit_limit::driver::Prepared;
/// use platformkit_limit::Postgres;
///
/// let store = Postgres::new(move || {
///     let pool = pool.clone();
///     async move { pool.get().await.map(Prepared) }
/// });
/// # let _ = store;
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
#[derive(Clone, Debug)]
pub struct Prepared<T>(pub T);

#[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
impl LimitConn for Prepared<deadpool_postgres::Pool> {
    type Conn = Prepared<deadpool_postgres::Object>;
    type Error = deadpool_postgres::PoolError;

    async fn conn(&self) -> Result<Self::Conn, deadpool_postgres::PoolError> {
        self.0.get().await.map(Prepared)
    }

    fn probe(&self) -> impl Future<Output = Option<Result<(), BoxError>>> + Send {
        probe(&self.0)
    }
}

impl<T> sealed::Sealed for Prepared<T>
where
    T: Deref<Target = deadpool_postgres::ClientWrapper> + Send,
{
    async fn send<'a, const N: usize>(
        &'a mut self,
        sql: &'static str,
        params: &'a [Param<'a>; N],
        cancel_at: Instant,
    ) -> (Result<Row, Failure>, Option<Instant>) {
        let wrapper: &deadpool_postgres::ClientWrapper = &self.0;
        let typed: [(&(dyn ToSql + Sync), Type); N] = std::array::from_fn(|i| typed(&params[i]));
        let answer = prepared_row(wrapper, &wrapper.statement_cache, sql, &typed);
        cancelling(wrapper, answer, cancel_at).await
    }

    async fn script(&mut self, script: &'static str) -> Result<(), Failure> {
        self.0.batch_execute(script).await.map_err(failure)
    }

    async fn rollback(&mut self) {
        let _ = self.0.batch_execute("ROLLBACK").await;
    }
}

/// The statement's one row, as the connection's prepared statement from
/// its `cache`.
async fn prepared_row<const N: usize>(
    client: &Client,
    cache: &deadpool_postgres::StatementCache,
    sql: &'static str,
    typed: &[(&(dyn ToSql + Sync), Type); N],
) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
    let types: [Type; N] = std::array::from_fn(|i| typed[i].1.clone());
    let values: [&(dyn ToSql + Sync); N] = std::array::from_fn(|i| typed[i].0);
    let statement = cache.prepare_typed(client, sql, &types).await?;
    let answer = client.query_one(&statement, &values).await;
    if let Err(e) = &answer {
        // The statement is gone from the connection (`DEALLOCATE ALL`,
        // `DISCARD ALL`, a PgBouncer that cannot carry it), or the
        // schema changed its result type under it ("cached plan must
        // not change result type"): the Bind ran nothing and the error
        // stands, loud; the next call on this connection prepares it
        // again.
        if [
            SqlState::INVALID_SQL_STATEMENT_NAME,
            SqlState::FEATURE_NOT_SUPPORTED,
        ]
        .iter()
        .any(|code| e.code() == Some(code))
        {
            cache.remove(sql, &types);
        }
    }
    answer
}
