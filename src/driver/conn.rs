//! [`LimitConn`]: the caller's connection source.
//!
//! The library keeps no pool and no connection between calls. For each
//! statement it sends (one call's, or one shared by the calls merged into
//! it) it asks the caller's source for one connection, sends that one
//! statement (a `CALL` of a procedure that commits its own transaction, or a
//! read that runs in none of its own), and hands the connection back idle.

use std::future::Future;

use super::Session;
use crate::error::BoxError;

/// Where the limiter gets a connection for one call: the counterpart of a
/// framework's "connection for this request".
///
/// The connection (a [`Session`]: a tokio-postgres client, or an sqlx
/// connection in a [`SqlxConn`](crate::driver::SqlxConn)) must be for exclusive use
/// during the call and idle (not inside a transaction) when handed over. The
/// limiter hands it back outside any transaction. On tokio-postgres, a call
/// near the end of its budget is cancelled on the server before the
/// connection is handed back (sqlx cannot cancel). Should the budget run out
/// anyway, the limiter's own `CALL` may still be running on it, and the next
/// statement on the connection waits for it (at most the `lock_timeout` the
/// call carried, plus the statement's own work); what it ends with is the
/// abandoned call's, never the next call's (see the guide's
/// [drivers](crate::guide#drivers) section for a connection the service
/// holds under sqlx). A connection handed over
/// inside a transaction is an
/// [`ErrorKind::InTransaction`](crate::ErrorKind::InTransaction) error, and
/// that transaction is rolled back, never committed.
///
/// Implemented for:
/// - an async closure returning a [`Session`]: anything that derefs to a
///   [`tokio_postgres::Client`] (a pool's object, a mutex guard), or an
///   [`SqlxConn`](crate::driver::SqlxConn);
/// - [`tokio_postgres::Config`]: connect for each call, without TLS;
/// - [`Connect`](crate::driver::Connect): connect for each call, with the TLS connector you give;
/// - deadpool and bb8 pools of tokio-postgres connections, and
///   `sqlx::PgPool`, behind the features of the same names.
///
/// Implement it for your own pool with an `async fn`:
///
/// ```
/// use platformkit_limit::LimitConn;
/// use std::sync::Arc;
/// use tokio::sync::{Mutex, OwnedMutexGuard};
///
/// /// One held connection, lent to one call at a time.
/// struct Held(Arc<Mutex<tokio_postgres::Client>>);
///
/// impl LimitConn for Held {
///     type Conn = OwnedMutexGuard<tokio_postgres::Client>;
///     type Error = std::convert::Infallible;
///
///     async fn conn(&self) -> Result<Self::Conn, Self::Error> {
///         Ok(self.0.clone().lock_owned().await)
///     }
/// }
/// ```
pub trait LimitConn: Send + Sync + 'static {
    /// The connection lent for one call.
    type Conn: Session;

    /// Why no connection could be had. The limiter treats it as the store
    /// being unreachable.
    type Error: Into<BoxError>;

    /// Lends one connection for one call.
    fn conn(&self) -> impl Future<Output = Result<Self::Conn, Self::Error>> + Send;

    /// Opens a connection of its own to the server the source lends from,
    /// outside any pool and its retries, and closes it: the store's probe
    /// of whether the server is down, asked when a call got no answer (the
    /// guide's [down or overloaded](crate::guide#down-or-overloaded)).
    /// `Some(Ok(()))` when the server completed the startup, the driver's
    /// error when it did not; the store reads the error (any SQLSTATE but
    /// the server going away is an answer) and bounds the wait.
    ///
    /// The default, `None`, is a source that cannot open a connection of
    /// its own (one that lends a held connection): the store then never
    /// reads the server as down, so a call that got no answer is shed,
    /// never failed open, unless its connection was refused at the
    /// transport. Give such a store a probe with
    /// [`Postgres::with_probe`](crate::Postgres::with_probe). Every source
    /// this crate implements has one.
    fn probe(&self) -> impl Future<Output = Option<Result<(), BoxError>>> + Send {
        std::future::ready(None)
    }
}

/// An async closure is a connection source: of tokio-postgres clients, as
/// here, or of sqlx connections in a [`SqlxConn`](crate::driver::SqlxConn).
///
/// ```
/// use std::sync::Arc;
/// use tokio::sync::Mutex;
///
/// # fn demo(client: tokio_postgres::Client) {
/// let held = Arc::new(Mutex::new(client));
/// let conns = move || {
///     let held = held.clone();
///     async move { Ok::<_, std::convert::Infallible>(held.lock_owned().await) }
/// };
/// let store = platformkit_limit::Postgres::new(conns);
/// # let _ = store;
/// # }
/// ```
impl<F, Fut, C, E> LimitConn for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<C, E>> + Send,
    C: Session,
    E: Into<BoxError>,
{
    type Conn = C;
    type Error = E;

    fn conn(&self) -> impl Future<Output = Result<C, E>> + Send {
        self()
    }
}
