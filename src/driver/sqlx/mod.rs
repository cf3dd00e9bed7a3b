//! [`Session`](super::Session) for sqlx (feature `sqlx` for sqlx 0.8,
//! `sqlx-09` for 0.9): [`SqlxConn`] over any sqlx PostgreSQL connection of
//! either version, and [`LimitConn`](crate::LimitConn) for each version's
//! `PgPool` (`version.rs`).
//!
//! The statement goes through sqlx's ordinary query path, as the service's
//! own queries do: prepared once per connection as a named statement and
//! cached (sqlx's statement cache), then one Bind, Execute and Sync per call:
//! one round trip. sqlx keeps the backend's cancel key private, so no cancel
//! request is ever sent: the server's `lock_timeout` bounds the lock waits
//! and the client gives up at the deadline.

// The driver, once for each sqlx version a feature names: the same source,
// `version.rs`, with `sqlx` naming that version's crate.
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

/// An sqlx PostgreSQL connection lent to the limiter: a
/// `PoolConnection<Postgres>` (what [`PgPool`](sqlx::PgPool) lends), a `PgConnection` held
/// in a mutex, or a `&mut PgConnection`: anything that dereferences to
/// something that gives a `&mut PgConnection`.
///
/// Like every connection, it must be idle when lent; one inside a
/// transaction is an [`ErrorKind::InTransaction`](crate::ErrorKind::InTransaction)
/// error, and that transaction is rolled back. sqlx cannot cancel a
/// statement on the server, and a call given up (at its budget, or dropped)
/// leaves its `CALL`'s answer owed on the connection: the limiter's next
/// call reads it first, the service's own next query would not. See the
/// guide's [drivers](crate::guide#drivers) section.
///
/// Lend a connection the service holds, one call at a time:
///
/// ```no_run
/// use platformkit_limit::driver::SqlxConn;
/// use platformkit_limit::{Limiter, Postgres};
/// use sqlx::{Connection, PgConnection};
/// use std::sync::Arc;
/// use tokio::sync::Mutex;
///
/// # async fn demo() -> Result<(), sqlx::Error> {
/// let held = Arc::new(Mutex::new(PgConnection::connect("postgres://app@db/app").await?));
/// let conns = move || {
///     let held = held.clone();
///     async move { Ok::<_, std::convert::Infallible>(SqlxConn(held.lock_owned().await)) }
/// };
/// let limiter = Limiter::new(Postgres::new(conns));
/// # let _ = limiter;
/// # Ok(())
/// # }
/// ```
///
/// Or lend the `PoolConnection` a request already holds (a transaction's is
/// refused: the connection must be idle) to a limiter for that request, and
/// keep using it through the same lock. The source owns what it lends (a
/// connection source is `'static`: the limiter's shared statements are sent
/// by a task of its own, which may still hold the connection for a moment
/// after a call that ran out of budget). A limiter built per request has
/// its own refusal cache and merging, so those help only across its calls;
/// share one limiter over a pool where you can.
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
        // sqlx keeps the cancel key private: nothing to cancel with.
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

/// What a lent sqlx connection does, for each version: implemented for
/// its `PgConnection` and its `PoolConnection<Postgres>`.
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
