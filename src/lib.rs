//! A rate limiter whose state is a row in PostgreSQL: one limit shared by
//! every replica, outliving every deploy.
//!
//! A [`Limiter`] answers "may this attempt go ahead?" with a [`Verdict`] and counts what you
//! tell it to, in [`Postgres`] (one statement a call, over your [`LimitConn`]) or, for unit
//! tests, [`Memory`]. An unreachable database leaves the verdict to the limit's
//! [`WhenUnreachable`]; any other failure is an [`Error`].
//!
//! ```
//! use platformkit_limit::{Key, Limit, Limiter, Memory};
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! // In production: Limiter::new(Postgres::new(pool)).
//! let limiter = Limiter::new(Memory::new());
//! let login = Limit::new("login", 3, Duration::from_secs(15 * 60))?;
//! let alice = Key::email("alice@example.com");
//!
//! for _ in 0..3 {
//!     // Before the password work:
//!     assert!(limiter.check(&login, &alice).await?.is_allowed());
//!     // After a wrong password:
//!     limiter.failed(&login, &alice).await?;
//! }
//! let verdict = limiter.check(&login, &alice).await?;
//! assert!(verdict.is_refused());
//! assert!(verdict.retry_after().is_some()); // for a 429's Retry-After
//! # Ok::<(), platformkit_limit::Error>(())
//! # }).unwrap();
//! ```
//!
//! Start from [`Limiter`], [`Limit`] and [`Key`]; then [`Postgres`], [`purge`] and the
//! [`metric`]s. How it works, and why, is in the [`guide`] ([in a service](guide#in-a-service):
//! the steps at start-up).
//!
//! # Features
//!
//! - `deadpool`, `bb8`, `sqlx` (sqlx 0.8), `sqlx-09` (sqlx 0.9): [`LimitConn`] for that pool
//!   (`deadpool_postgres::Pool`, `bb8::Pool` of `bb8_postgres::PostgresConnectionManager`,
//!   `sqlx::PgPool`), with `driver::Prepared` (deadpool) and `driver::SqlxConn` (sqlx)
//!   ([drivers](guide#drivers));
//! - `tracing` (on by default): events on fail-open, shed calls and purges, never with the key.
//!
//! Beside it, over its public API: the tower layer `LimitLayer` (the crate
//! `platformkit-limit-tower`), the admin page and the operator's tool (`platformkit-limit-admin`,
//! `platformkit-limit-cli`).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]

mod audit;
mod cache;
mod clock;
mod decide;
pub mod driver;
mod error;
pub mod guide;
mod key;
mod limit;
mod limiter;
mod merge;
pub mod metric;
mod purging;
mod store;
mod trace;
mod verdict;

pub use crate::audit::{AuditAction, AuditEntry};
pub use crate::clock::ManualClock;
pub use crate::driver::LimitConn;
pub use crate::error::{BoxError, Error, ErrorKind};
pub use crate::key::Key;
pub use crate::limit::{Limit, LimitBuilder, OnSuccess, Strategy, WhenUnreachable};
pub use crate::limiter::{
    Ask, KeyStatus, Limiter, LimiterBuilder, Permit, Permits, Reservation, Reservations,
};
pub use crate::purging::{PurgeTask, purge};
pub use crate::store::Store;
pub use crate::store::memory::Memory;
pub use crate::store::postgres::Postgres;
pub use crate::store::sql::grants;
pub use crate::verdict::{Verdict, Verdicts};

/// The schema `platformkit` ([guide](crate::guide#the-schema)), a script safe to apply twice,
/// for your own migrations; then run [`grants`] for the limiter's role. PostgreSQL 14 or newer.
pub const SCHEMA: &str = store::sql::SCHEMA;

/// The version of [`SCHEMA`], raised by one whenever a release changes it. A database where
/// `SELECT platformkit.platformkit_schema_version()` answers less, or fails, needs it again.
pub const SCHEMA_VERSION: u32 = store::sql::SCHEMA_VERSION;

/// Internals for the fuzz targets and property tests (feature `internal-checks`): not public
/// API, not covered by semver.
#[cfg(feature = "internal-checks")]
#[doc(hidden)]
pub mod internal {
    pub use crate::key::{decode, is_default_ignorable, normalize_identity};
}
