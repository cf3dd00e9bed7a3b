//! [`LimitConn`] for [`deadpool_postgres::Pool`] (feature `deadpool`), and [`Prepared`].

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

/// A connection borrowed from a [`deadpool_postgres::Pool`] for one call; back when dropped.
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

/// A deadpool pool, or one of its connections, on which the limiter prepares each statement once
/// per connection in deadpool's statement cache. Opt-in: it needs what sqlx needs of PgBouncer
/// ([drivers](crate::guide#drivers)).
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
/// A held connection (one that derefs to a [`deadpool_postgres::ClientWrapper`]), from a closure:
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

/// The statement's one row, prepared from the connection's `cache`.
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
        // Deallocated behind the cache, or its type changed: the next call prepares again.
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
