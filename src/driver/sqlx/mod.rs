//! [`Session`](super::Session) for sqlx 0.8 and 0.9 ([`SqlxConn`]), and
//! [`LimitConn`](crate::LimitConn) for each version's `PgPool`, through sqlx's statement cache.

// `version.rs` once per sqlx version a feature names.
#[cfg(feature = "sqlx")]
pub(super) mod v08 {
    use ::sqlx;
    include!("version.rs");
}
#[cfg(feature = "sqlx-09")]
pub(super) mod v09 {
    use ::sqlx_09 as sqlx;
    include!("version.rs");
}

use std::future::Future;
use std::ops::DerefMut;

use tokio::time::Instant;

use super::{Failure, Param, Row, sealed};

/// An sqlx PostgreSQL connection lent to the limiter: anything that dereferences to something
/// that gives a `&mut PgConnection` (a `PoolConnection`, a `PgConnection` in a mutex). It must
/// be idle when lent; what a call given up leaves on it:
/// [what sqlx cannot do](crate::guide#what-sqlx-cannot-do-cancel).
///
/// A connection the service holds (a `PgConnection`, or the idle `PoolConnection` a request
/// holds) is lent one call at a time through a mutex, and stays usable through the same lock.
/// The source owns what it lends (a flight may hold it a moment after a call ran out of
/// budget). A limiter per request has its own refusal cache and merging: share one over a pool
/// where you can.
///
/// ```no_run
/// use platformkit_limit::driver::SqlxConn;
/// use platformkit_limit::{Key, Limit, Limiter, Postgres};
/// use sqlx::{pool::PoolConnection, Postgres as Pg};
/// use std::sync::Arc;
/// use tokio::sync::Mutex;
///
/// # async fn demo(conn: PoolConnection<Pg>, login: &Limit) -> Result<(), platformkit_limit::Error> {
/// let held = Arc::new(Mutex::new(conn));
/// let lent = held.clone();
/// let limiter = Limiter::new(Postgres::new(move || {
///     let lent = lent.clone();
///     async move { Ok::<_, std::convert::Infallible>(SqlxConn(lent.lock_owned().await)) }
/// }));
/// let verdict = limiter.check(login, &Key::email("alice@example.com")).await?;
/// // The request's own queries, on the same connection, one at a time.
/// let conn = held.lock().await;
/// # let _ = (verdict, conn);
/// # Ok(())
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlx", feature = "sqlx-09"))))]
#[derive(Debug)]
pub struct SqlxConn<C>(pub C);

impl<C> SqlxConn<C> {
    /// The connection given back.
    pub fn into_inner(self) -> C {
        self.0
    }
}

impl<C> sealed::Sealed for SqlxConn<C>
where
    C: DerefMut + Send,
    C::Target: lent::Lent,
{
    async fn send<'a, const N: usize>(
        &'a mut self,
        sql: &'static str,
        params: &'a [Param<'a>; N],
        // Unused: see `SqlxConn`.
        _cancel_at: Instant,
    ) -> (Result<Row, Failure>, Option<Instant>) {
        (lent::Lent::send(&mut *self.0, sql, params).await, None)
    }

    fn script(
        &mut self,
        script: &'static str,
    ) -> impl Future<Output = Result<(), Failure>> + Send + '_ {
        lent::Lent::script(&mut *self.0, script)
    }

    fn rollback(&mut self) -> impl Future<Output = ()> + Send + '_ {
        lent::Lent::rollback(&mut *self.0)
    }
}

/// What a lent sqlx connection does, for each version's connections.
pub(crate) mod lent {
    use super::*;

    pub trait Lent: Send {
        /// Sends `sql` with `params` and reads its one row.
        fn send<'a, const N: usize>(
            &'a mut self,
            sql: &'static str,
            params: &'a [Param<'a>; N],
        ) -> impl Future<Output = Result<Row, Failure>> + Send + 'a;

        /// Runs `script` as one simple-query message.
        fn script(
            &mut self,
            script: &'static str,
        ) -> impl Future<Output = Result<(), Failure>> + Send + '_;

        /// Rolls back the transaction it was lent inside (best effort).
        fn rollback(&mut self) -> impl Future<Output = ()> + Send + '_;
    }
}
