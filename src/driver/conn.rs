//! [`LimitConn`]: the caller's connection source. The crate keeps no pool,
//! and no connection once no write waits
//! ([merging](crate::guide#merging)).

use std::future::Future;

use super::Session;
use crate::error::BoxError;

/// Where the limiter gets a connection for one call: the counterpart of a
/// framework's "connection for this request".
///
/// The connection (a [`Session`]) must be for exclusive use during the call
/// and idle when handed over; the limiter hands it back outside any
/// transaction. One handed over inside a transaction is an
/// [`ErrorKind::InTransaction`](crate::ErrorKind::InTransaction) error, and
/// that transaction is rolled back, never committed. A statement given up
/// at the deadline may still run on it for a while
/// ([drivers](crate::guide#drivers)).
///
/// Implemented for an async closure returning a [`Session`],
/// [`tokio_postgres::Config`] and [`Connect`](crate::driver::Connect)
/// (a connection per call), and the pools of deadpool, bb8 and sqlx behind
/// their features. Implement it for your own pool with an `async fn`:
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

    /// Why no connection could be had: the store unreachable, unless the
    /// server answered.
    type Error: Into<BoxError>;

    /// Lends one connection for one call.
    fn conn(&self) -> impl Future<Output = Result<Self::Conn, Self::Error>> + Send;

    /// Opens and closes a connection of its own, outside any pool: the
    /// store's probe of whether the server is down
    /// ([down or overloaded](crate::guide#down-or-overloaded)).
    /// `Some(Ok(()))` when the server completed the startup, else the
    /// driver's error. The default, `None`, is a source that cannot (one
    /// that lends a held connection): give its store
    /// [`Postgres::with_probe`](crate::Postgres::with_probe).
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
