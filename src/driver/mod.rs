//! The connections a [`Postgres`](crate::Postgres) store borrows ([`LimitConn`]) and the
//! [`Session`] it sends its one statement on; how the drivers differ is in the
//! [guide](crate::guide#drivers).
//!
//! ```no_run
//! # #[cfg(feature = "sqlx")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use platformkit_limit::{Limiter, Postgres};
//!
//! let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
//! // The service's own pool: no second one for the limiter.
//! let limiter = Limiter::new(Postgres::new(pool.clone()));
//! # let _ = limiter;
//! # Ok(())
//! # }
//! ```
//!
//! The pool's wait counts against the call's budget: a full pool sheds the call
//! ([down or overloaded](crate::guide#down-or-overloaded)), never hangs.

#[cfg(feature = "bb8")]
pub(crate) mod bb8;
#[cfg(feature = "deadpool")]
pub(crate) mod deadpool;
#[cfg(any(feature = "sqlx", feature = "sqlx-09"))]
pub(crate) mod sqlx;
pub(crate) mod tokio_postgres;

#[cfg(feature = "deadpool")]
pub use self::deadpool::{DeadpoolConn, Prepared};
#[cfg(any(feature = "sqlx", feature = "sqlx-09"))]
pub use self::sqlx::SqlxConn;
pub use self::tokio_postgres::{Connect, Connected};

// Sealed: out of the public API, though the sealed trait names them.
pub(crate) use self::sealed::{Columns, Failure, Param, Row};

use std::future::Future;

use ::tokio_postgres::error::SqlState;
use tokio::time::Instant;

use crate::error::{BoxError, Error, Reading};
use crate::metric::Operation;

/// Where the limiter gets a connection for one call ([drivers](crate::guide#drivers)).
///
/// The connection (a [`Session`]) must be for exclusive use during the call and idle when
/// handed over (inside a transaction: [`InTransaction`](crate::ErrorKind::InTransaction), that
/// transaction rolled back); it comes back outside any transaction, though a statement given up
/// at the deadline may still run on it for a while.
///
/// Implemented for an async closure, [`tokio_postgres::Config`](::tokio_postgres::Config),
/// [`Connect`] and the pools behind their features. For your own pool:
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
/// connections in a [`SqlxConn`].
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

/// A connection the limiter can send its statement on: what a [`LimitConn`] lends. Implemented
/// for anything that derefs to a [`tokio_postgres::Client`](::tokio_postgres::Client), for
/// `Prepared` and for [`SqlxConn`]. Sealed: bring your own pool through [`LimitConn`].
pub trait Session: sealed::Sealed {}

impl<T: sealed::Sealed> Session for T {}

pub(crate) mod sealed {
    use super::*;

    /// One bind parameter, typed as the procedure's argument is.
    #[derive(Clone, Copy, Debug)]
    pub enum Param<'a> {
        Text(&'a str),
        Int8(i64),
        Bool(bool),
        /// `int8`, `NULL` for `None`
        MaybeInt8(Option<i64>),
        /// `double precision`, `NULL` for `None`
        Float8(Option<f64>),
        TextArray(&'a [&'a str]),
        Int8Array(&'a [i64]),
        BoolArray(&'a [bool]),
    }

    /// The one row a statement answered, as its driver read it.
    #[derive(Debug)]
    pub struct Row(pub(in crate::driver) Box<dyn Columns>);

    /// A driver's row, read by column: one method for each type the procedures answer with.
    pub trait Columns: Send + std::fmt::Debug {
        /// `boolean`, never `NULL`
        fn boolean(&self, index: usize) -> Result<bool, Failure>;
        fn int8(&self, index: usize) -> Result<i64, Failure>;
        fn int8s(&self, index: usize) -> Result<Vec<i64>, Failure>;
        fn texts(&self, index: usize) -> Result<Vec<String>, Failure>;
        /// `double precision`, or `NULL`
        fn maybe_float8(&self, index: usize) -> Result<Option<f64>, Failure>;
    }

    /// A driver's error, read into the SQLSTATE table's terms, kept as the crate error's cause.
    #[derive(Debug)]
    pub struct Failure {
        reading: Reading,
        source: BoxError,
    }

    impl Failure {
        /// `source`, as its driver reads it.
        pub(crate) fn new(reading: Reading, source: impl Into<BoxError>) -> Self {
            Failure {
                reading,
                source: source.into(),
            }
        }

        /// What the error says.
        pub(crate) fn reading(&self) -> &Reading {
            &self.reading
        }

        /// The crate's error for this failure ([`Error::read`]).
        pub(crate) fn into_error(self, operation: Operation, cancel_sent: bool) -> Error {
            Error::read(operation, self.reading, self.source, cancel_sent)
        }
    }

    /// The methods of [`Session`], out of callers' reach.
    pub trait Sealed: Send {
        /// Sends `sql` with `params` and reads its one row, cancelling it if unanswered at
        /// `cancel_at` where the driver can; with when that cancel was delivered, if it was.
        fn send<'a, const N: usize>(
            &'a mut self,
            sql: &'static str,
            params: &'a [Param<'a>; N],
            cancel_at: Instant,
        ) -> impl Future<Output = (Result<Row, Failure>, Option<Instant>)> + Send + 'a;

        /// Runs `script` as one simple-query message, for `Postgres::migrate`.
        fn script(
            &mut self,
            script: &'static str,
        ) -> impl Future<Output = Result<(), Failure>> + Send + '_;

        /// Rolls back the caller's transaction (best effort).
        fn rollback(&mut self) -> impl Future<Output = ()> + Send + '_;
    }
}

impl std::ops::Deref for Row {
    type Target = dyn sealed::Columns;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// A connection source's failure, as the crate's error ([`Error::connect`]).
pub(crate) fn connect_error(operation: Operation, source: BoxError) -> Error {
    let refused_by = chain(&*source).find_map(refused_while_up);
    Error::connect(operation, source, refused_by)
}

/// Whether `error`, a probe's failure to start a connection, shows a server that answered.
pub(crate) fn server_answered(error: &(dyn std::error::Error + 'static)) -> bool {
    chain(error).any(|link| refused_while_up(link).is_some())
}

/// Whether `error`'s chain shows a connection refused at the transport: the server is down.
pub(crate) fn refused_at_transport(error: &(dyn std::error::Error + 'static)) -> bool {
    chain(error).any(|link| {
        link.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// What a probe asks once connected. Before PostgreSQL 14 it is refused (`42704`): an answer.
pub(crate) const IN_RECOVERY: &str = "SHOW in_hot_standby";

/// A probe's connection reached a hot standby: down as a primary.
#[derive(Debug)]
pub(crate) struct InRecovery;

impl std::fmt::Display for InRecovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server is a hot standby (in recovery), not a primary")
    }
}

impl std::error::Error for InRecovery {}

/// `error` and its sources, in order.
fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| e.source())
}

/// Whether `error`, one link of a source's error chain, shows a server up and refusing, and
/// with which SQLSTATE.
fn refused_while_up(error: &(dyn std::error::Error + 'static)) -> Option<Option<SqlState>> {
    DRIVERS.iter().find_map(|driver| driver(error))
}

/// A driver's [`refused_while_up`] for its own errors (`None` for others).
pub(crate) type SourceErrors = fn(&(dyn std::error::Error + 'static)) -> Option<Option<SqlState>>;

/// Every driver (deadpool's and bb8's errors carry tokio-postgres's).
const DRIVERS: &[SourceErrors] = &[
    self::tokio_postgres::ERRORS,
    #[cfg(feature = "sqlx")]
    self::sqlx::v08::ERRORS,
    #[cfg(feature = "sqlx-09")]
    self::sqlx::v09::ERRORS,
];

/// Awaits `answer`, running `cancel` once if it is pending at `cancel_at`; with when the
/// cancel was delivered, if it was.
pub(crate) async fn answer_or_cancel<F: Future, C: Future<Output = bool>>(
    answer: F,
    cancel_at: Instant,
    cancel: impl FnOnce() -> C,
) -> (F::Output, Option<Instant>) {
    tokio::pin!(answer);
    tokio::select! {
        biased;
        answer = &mut answer => (answer, None),
        () = tokio::time::sleep_until(cancel_at) => {
            let delivered = async { cancel().await.then(Instant::now) };
            tokio::join!(answer, delivered)
        }
    }
}
