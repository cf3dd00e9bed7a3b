//! The drivers: the connections a [`Postgres`](crate::Postgres) store
//! borrows, and the [`Session`] it sends its one statement on. One file per
//! driver, each holding its connection sources and its session; the store
//! takes any [`LimitConn`], which the crate's root holds.
//!
//! - tokio-postgres: anything that derefs to a
//!   [`tokio_postgres::Client`](::tokio_postgres::Client) is a session, and
//!   [`Connect`] makes a connection for each call ([`Connected`]);
//! - deadpool (feature `deadpool`): deadpool's pool, lending
//!   [`DeadpoolConn`]; [`Prepared`] prepares each statement once per
//!   connection;
//! - bb8 (feature `bb8`): bb8's pool of tokio-postgres connections;
//! - sqlx (feature `sqlx` for sqlx 0.8, `sqlx-09` for 0.9; both may be
//!   on): each version's `PgPool`, and [`SqlxConn`] over any sqlx
//!   PostgreSQL connection of either.
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
//! Each call borrows one pooled connection and returns it idle. The pool's
//! own wait counts against the call's budget: a full pool sheds the call
//! once the budget is spent (the guide's
//! [down or overloaded](crate::guide#down-or-overloaded)), never a hang.

// What a session does for the stores: send one statement (a text from
// `store::sql`) with typed parameters and read its one row; and, on
// failure, say what went wrong in terms the one SQLSTATE table reads (a
// code, or the connection being gone). Cancelling on the server near the
// deadline is done by the drivers that can. Each source opens a connection
// of its own for the store's probe (`LimitConn::probe`).

#[cfg(feature = "bb8")]
pub(crate) mod bb8;
mod conn;
#[cfg(feature = "deadpool")]
pub(crate) mod deadpool;
#[cfg(any(feature = "sqlx", feature = "sqlx-09"))]
pub(crate) mod sqlx;
pub(crate) mod tokio_postgres;

pub use self::conn::LimitConn;
#[cfg(feature = "deadpool")]
pub use self::deadpool::{DeadpoolConn, Prepared};
#[cfg(any(feature = "sqlx", feature = "sqlx-09"))]
pub use self::sqlx::SqlxConn;
pub use self::tokio_postgres::{Connect, Connected};

// In the sealed module, so that they stay out of the public API: the
// sealed trait's signature names them.
pub(crate) use self::sealed::{Columns, Failure, Param, Row};

use std::future::Future;

use ::tokio_postgres::error::SqlState;
use tokio::time::Instant;

use crate::error::{BoxError, Error, Reading};
use crate::operation::Operation;

/// A connection the limiter can send its statement on: the type a
/// [`LimitConn`] lends.
///
/// Implemented for:
/// - anything that derefs to a [`tokio_postgres::Client`](::tokio_postgres::Client) (a pool's object,
///   a mutex guard, [`Connected`]): the statement is
///   cancelled on the server near the end of the budget;
/// - `Prepared` over a deadpool connection, with the `deadpool` feature: the
///   same, each statement prepared once per connection;
/// - [`SqlxConn`] over an sqlx PostgreSQL connection (a
///   `PoolConnection<Postgres>`, a held `PgConnection`), with the `sqlx`
///   feature: sqlx does not expose what a cancel request needs, so the
///   server's `lock_timeout` bounds the call's lock waits and the client
///   gives up at the deadline (the guide's
///   [drivers](crate::guide#drivers) section says what that means).
///
/// The trait is sealed: what a connection must do (one statement, one round
/// trip, errors read by the SQLSTATE table, the cancel) belongs to the
/// drivers this crate supports. Bring your own pool through
/// [`LimitConn`] instead.
pub trait Session: sealed::Sealed {}

impl<T: sealed::Sealed> Session for T {}

pub(crate) mod sealed {
    use super::*;

    /// One bind parameter, typed as the procedure's argument is.
    #[derive(Clone, Copy, Debug)]
    pub enum Param<'a> {
        /// `text`
        Text(&'a str),
        /// `int8`
        Int8(i64),
        /// `bool`
        Bool(bool),
        /// `int8`, `NULL` for `None`
        MaybeInt8(Option<i64>),
        /// `double precision`, `NULL` for `None`
        Float8(Option<f64>),
        /// `text[]`
        TextArray(&'a [&'a str]),
        /// `int8[]`
        Int8Array(&'a [i64]),
        /// `boolean[]`
        BoolArray(&'a [bool]),
    }

    /// The one row a statement answered, as its driver read it.
    #[derive(Debug)]
    pub struct Row(pub(in crate::driver) Box<dyn Columns>);

    /// A driver's row, read by column: one method for each type the
    /// procedures answer with.
    pub trait Columns: Send + std::fmt::Debug {
        /// `boolean`, never `NULL`
        fn boolean(&self, index: usize) -> Result<bool, Failure>;
        /// `int8`
        fn int8(&self, index: usize) -> Result<i64, Failure>;
        /// `int8[]`
        fn int8s(&self, index: usize) -> Result<Vec<i64>, Failure>;
        /// `text[]`
        fn texts(&self, index: usize) -> Result<Vec<String>, Failure>;
        /// `double precision`, or `NULL`
        fn maybe_float8(&self, index: usize) -> Result<Option<f64>, Failure>;
    }

    /// A driver's error, read where it happened into the terms the
    /// SQLSTATE table reads, and kept as the cause of the crate's error.
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

        /// What the error says: a SQLSTATE, or the connection gone, or
        /// neither.
        pub(crate) fn reading(&self) -> &Reading {
            &self.reading
        }

        /// The crate's error for this failure, as the SQLSTATE table sorts
        /// it ([`Error::read`]). A cancel is the budget running out only
        /// when this call sent it (`cancel_sent`).
        pub(crate) fn into_error(self, operation: Operation, cancel_sent: bool) -> Error {
            Error::read(operation, self.reading, self.source, cancel_sent)
        }
    }

    /// The methods of [`Session`], out of callers' reach.
    pub trait Sealed: Send {
        /// Sends `sql` with `params` (in the order of its `$n`) and reads its
        /// one row. A driver that can cancels the statement on the server if
        /// it is still unanswered at `cancel_at`; the second value says
        /// when it delivered that cancel request, if it did.
        fn send<'a, const N: usize>(
            &'a mut self,
            sql: &'static str,
            params: &'a [Param<'a>; N],
            cancel_at: Instant,
        ) -> impl Future<Output = (Result<Row, Failure>, Option<Instant>)> + Send + 'a;

        /// Runs `script`, several statements with no parameters, as one
        /// simple-query message: the schema, for
        /// [`Postgres::migrate`](crate::Postgres::migrate).
        fn script(
            &mut self,
            script: &'static str,
        ) -> impl Future<Output = Result<(), Failure>> + Send + '_;

        /// Rolls back the transaction the connection was lent inside, so that
        /// it goes back idle. Best effort: the error already says what
        /// happened.
        fn rollback(&mut self) -> impl Future<Output = ()> + Send + '_;
    }
}

impl std::ops::Deref for Row {
    type Target = dyn sealed::Columns;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// A connection source's failure, as the crate's error: unreachable, unless
/// a driver's error in its chain shows a server that is up and refused
/// ([`refused_while_up`], the first link that does).
pub(crate) fn connect_error(operation: Operation, source: BoxError) -> Error {
    let refused_by = chain(&*source).find_map(refused_while_up);
    Error::connect(operation, source, refused_by)
}

/// Whether `error`, a probe's failure to start a connection, shows a
/// server that answered: a refusal with a SQLSTATE other than the server
/// going away (`53300` every slot taken, `28P01` a wrong password), or an
/// authentication the driver could not complete. No answer at the
/// transport, and a server that says it is starting, shutting down or in
/// recovery (`57P03`, `57P01`), did not.
pub(crate) fn server_answered(error: &(dyn std::error::Error + 'static)) -> bool {
    chain(error).any(|link| refused_while_up(link).is_some())
}

/// Whether `error`'s chain shows the server's address refusing the
/// connection at the transport: nothing listens there, so it is down.
pub(crate) fn refused_at_transport(error: &(dyn std::error::Error + 'static)) -> bool {
    chain(error).any(|link| {
        link.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// What a probe asks once connected: whether the server is a hot standby
/// (in recovery). An older server (before PostgreSQL 14) refuses the name
/// (`42704`): an answer all the same.
pub(crate) const IN_RECOVERY: &str = "SHOW in_hot_standby";

/// A probe's connection reached a hot standby: a server in recovery,
/// down as a primary.
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

/// Whether `error`, one link of a connection source's error chain, shows a
/// server that is up and refused the connection rather than an outage (a
/// misconfiguration, or the server out of a resource, class `53`), and with
/// which SQLSTATE: `None` when it does not (or is no driver's error).
fn refused_while_up(error: &(dyn std::error::Error + 'static)) -> Option<Option<SqlState>> {
    DRIVERS.iter().find_map(|driver| driver(error))
}

/// What a driver reads in one link of a connection source's error chain,
/// for its own error types only (`None` for any other): whether it shows a
/// server that is up and refused, with its SQLSTATE (see [`connect_error`]).
pub(crate) type SourceErrors = fn(&(dyn std::error::Error + 'static)) -> Option<Option<SqlState>>;

/// Every driver built in: the one list a new driver joins.
/// (deadpool's and bb8's errors carry tokio-postgres's as their sources.)
const DRIVERS: &[SourceErrors] = &[
    self::tokio_postgres::ERRORS,
    #[cfg(feature = "sqlx")]
    self::sqlx::v08::ERRORS,
    #[cfg(feature = "sqlx-09")]
    self::sqlx::v09::ERRORS,
];

/// Awaits `answer`; if it is still pending at `cancel_at`, starts `cancel`
/// once and awaits both: the cancel request is finished before the answer
/// is returned. Returns the answer and, when a cancel request was delivered
/// (`cancel` answers whether it was), when it was.
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
