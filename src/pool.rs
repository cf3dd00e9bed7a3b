//! [`LimitConn`] for the pools our users hold, behind cargo features.
//!
//! - `deadpool`: [`deadpool_postgres::Pool`], and, opted into, the same pool
//!   with each statement prepared once per connection ([`Prepared`]);
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

        fn saturated(&self) -> Option<bool> {
            Some(saturated(self))
        }
    }

    /// A deadpool pool, or one of its connections, on which the limiter
    /// prepares each of its statements once per connection and keeps it in
    /// that connection's statement cache (deadpool's `prepare_typed_cached`).
    ///
    /// Without it a statement goes as one unnamed Parse, Bind, Execute and
    /// Sync, and the server parses and plans it on every call. Through
    /// `Prepared`, the first call on each connection prepares it (one more
    /// round trip, once) and every later call sends only Bind, Execute and
    /// Sync: still one round trip, and on the server about a quarter of a
    /// read's work and a seventh of a write's saved (the figures are in
    /// `docs/PERFORMANCE.md`). Results, errors, the budget and the cancel
    /// request are the same as without it.
    ///
    /// It is opt-in because named prepared statements must reach the
    /// backend that prepared them: through PgBouncer in transaction mode,
    /// only version 1.21 or newer with `max_prepared_statements` set passes
    /// them on; an older one makes calls fail with a hard error
    /// ([`ErrorKind::Query`](crate::ErrorKind::Query)), never count wrong.
    /// Should the connection's statements be deallocated behind the cache
    /// (`DEALLOCATE ALL`, `DISCARD ALL`; deadpool's own recycling never
    /// does), that call fails the same way and the next one prepares the
    /// statement again. Each statement a connection has sent stays prepared
    /// on its backend for the connection's life.
    ///
    /// ```no_run
    /// # async fn demo(pool: deadpool_postgres::Pool) {
    /// use platformkit_limit::{Limiter, Postgres, Prepared};
    ///
    /// let limiter = Limiter::new(Postgres::new(Prepared(pool)));
    /// # let _ = limiter;
    /// # }
    /// ```
    ///
    /// A held deadpool connection (anything that derefs to a
    /// [`deadpool_postgres::ClientWrapper`], such as a
    /// `deadpool_postgres::Object`) is lent the same way, from a closure:
    ///
    /// ```no_run
    /// # async fn demo(pool: deadpool_postgres::Pool) {
    /// use platformkit_limit::{Postgres, Prepared};
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

    /// Whether the pool is at its size with no connection idle.
    fn saturated(pool: &deadpool_postgres::Pool) -> bool {
        let status = pool.status();
        status.size >= status.max_size && status.available == 0
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    impl LimitConn for Prepared<deadpool_postgres::Pool> {
        type Conn = Prepared<deadpool_postgres::Object>;
        type Error = deadpool_postgres::PoolError;

        async fn conn(&self) -> Result<Self::Conn, deadpool_postgres::PoolError> {
            self.0.get().await.map(Prepared)
        }

        fn saturated(&self) -> Option<bool> {
            Some(saturated(&self.0))
        }
    }
}

#[cfg(feature = "deadpool")]
pub use deadpool_impl::{DeadpoolConn, Prepared};

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
