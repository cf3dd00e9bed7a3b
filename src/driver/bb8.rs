//! [`LimitConn`] for [`bb8::Pool`] of [`bb8_postgres::PostgresConnectionManager`] (feature `bb8`).

use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::Socket;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};

use crate::LimitConn;
use crate::error::BoxError;

/// ```no_run
/// # async fn demo(pool: bb8::Pool<bb8_postgres::PostgresConnectionManager<tokio_postgres::NoTls>>) {
/// use platformkit_limit::{Limiter, Postgres};
///
/// let limiter = Limiter::new(Postgres::new(pool));
/// # let _ = limiter;
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "bb8")))]
impl<T> LimitConn for bb8::Pool<PostgresConnectionManager<T>>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    type Conn = bb8::PooledConnection<'static, PostgresConnectionManager<T>>;
    type Error = bb8::RunError<tokio_postgres::Error>;

    async fn conn(&self) -> Result<Self::Conn, Self::Error> {
        self.get_owned().await
    }

    /// A connection outside the pool and its retries, given to the pool once the server answers:
    /// bb8 backs its own reconnects off, and the pool could stay empty after the server is back.
    async fn probe(&self) -> Option<Result<(), BoxError>> {
        let started = async {
            let client = self.dedicated_connection().await?;
            super::tokio_postgres::started(&client).await?;
            // A full pool gives it back, and it closes.
            let _ = self.add(client);
            Ok(())
        };
        Some(started.await)
    }
}
