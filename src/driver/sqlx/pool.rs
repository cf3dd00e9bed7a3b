//! [`LimitConn`] for sqlx's [`PgPool`].

use sqlx::postgres::{PgConnection, PgPool, Postgres};
use sqlx::{Connection as _, Executor as _, Row as _};

use super::SqlxConn;
use crate::LimitConn;
use crate::error::BoxError;

/// Each call borrows one connection from the pool and gives it back idle.
/// The pool's wait counts against the call's budget.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use platformkit_limit::{Limiter, Postgres};
///
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
/// // The service's own pool: no second one for the limiter.
/// let limiter = Limiter::new(Postgres::new(pool.clone()));
/// # let _ = limiter;
/// # Ok(())
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
impl LimitConn for PgPool {
    type Conn = SqlxConn<sqlx::pool::PoolConnection<Postgres>>;
    type Error = sqlx::Error;

    async fn conn(&self) -> Result<Self::Conn, sqlx::Error> {
        // Not `try_acquire`: it skips the pool's check of an idle connection
        // (`test_before_acquire`), and would lend one the server closed.
        self.acquire().await.map(SqlxConn)
    }

    /// A connection of its own, made with the pool's options, outside the
    /// pool and its retries (sqlx's pool retries a refused connection in
    /// silence until its acquire timeout).
    async fn probe(&self) -> Option<Result<(), BoxError>> {
        let started = async {
            let mut conn = PgConnection::connect_with(&self.connect_options()).await?;
            let shown = in_hot_standby(&mut conn).await;
            let _ = conn.close().await;
            if shown? {
                return Err(crate::driver::InRecovery.into());
            }
            Ok::<_, BoxError>(())
        };
        Some(started.await)
    }
}

/// Whether the server of `conn` is a hot standby, as it says.
async fn in_hot_standby(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let shown = conn
        .fetch_all(sqlx::raw_sql(crate::driver::IN_RECOVERY))
        .await?;
    Ok(shown
        .iter()
        .any(|row| row.try_get::<String, _>(0).is_ok_and(|on| on == "on")))
}
