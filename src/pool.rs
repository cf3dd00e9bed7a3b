//! [`LimitConn`] for the pools our users hold, behind cargo features.
//!
//! - `deadpool`: [`deadpool_postgres::Pool`];
//! - `bb8`: [`bb8::Pool`] of [`bb8_postgres::PostgresConnectionManager`].
//!
//! Each call borrows one pooled connection and returns it idle. The pool's
//! own wait counts against the call's budget: an exhausted pool is an
//! unreachable store once the budget is spent, never a hang.

#[cfg(feature = "deadpool")]
mod deadpool_impl {
    use std::ops::Deref;

    use tokio_postgres::Client;

    use crate::LimitConn;

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
    }
}

#[cfg(feature = "deadpool")]
pub use deadpool_impl::DeadpoolConn;

#[cfg(feature = "bb8")]
mod bb8_impl {
    use bb8_postgres::PostgresConnectionManager;
    use tokio_postgres::Socket;
    use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};

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
}
