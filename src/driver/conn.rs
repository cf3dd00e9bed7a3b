//! [`LimitConn`]: the caller's connection source.

use std::future::Future;

use super::Session;
use crate::error::BoxError;

/// Where the limiter gets a connection for one call ([drivers](crate::guide#drivers)).
///
/// The connection (a [`Session`]) must be for exclusive use during the call and idle when
/// handed over (inside a transaction: [`InTransaction`](crate::ErrorKind::InTransaction), that
/// transaction rolled back); it comes back outside any transaction, though a statement given up
/// at the deadline may still run on it for a while.
///
/// Implemented for an async closure, [`tokio_postgres::Config`],
/// [`Connect`](crate::driver::Connect) and the pools behind their features. For your own pool:
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

    /// Why no connection could be had: the store unreachable, unless the server answered.
    type Error: Into<BoxError>;

    /// Lends one connection for one call.
    fn conn(&self) -> impl Future<Output = Result<Self::Conn, Self::Error>> + Send;

    /// Opens and closes a connection of its own, outside any pool: the store's probe of whether
    /// the server is down ([down or overloaded](crate::guide#down-or-overloaded)). `Some(Ok(()))`
    /// when the startup completed, else the driver's error; the default `None` is a source that
    /// cannot (give its store [`Postgres::with_probe`](crate::Postgres::with_probe)).
    fn probe(&self) -> impl Future<Output = Option<Result<(), BoxError>>> + Send {
        std::future::ready(None)
    }
}

/// An async closure is a connection source: of tokio-postgres clients, as here, or of sqlx
/// connections in a [`SqlxConn`](crate::driver::SqlxConn).
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
