//! [`LimitConn`] for [`bb8::Pool`] of
//! [`bb8_postgres::PostgresConnectionManager`] (feature `bb8`): its
//! connections are tokio-postgres clients, whose
//! [`Session`](super::Session) is `tokio_postgres.rs`'s.

use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::Socket;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};

use super::SourceErrors;
use crate::LimitConn;

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
}

/// How bb8's errors read in a connection source's chain: a wait for a
/// connection that ran out is a wait (its backend's errors are
/// tokio-postgres's).
pub(super) const ERRORS: SourceErrors = SourceErrors {
    refused_while_up: |_| None,
    waited_for_pool: |error| {
        matches!(
            error.downcast_ref::<bb8::RunError<tokio_postgres::Error>>(),
            Some(bb8::RunError::TimedOut)
        )
    },
};
