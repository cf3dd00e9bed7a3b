#![deny(missing_docs)]
#![doc = include_str!("../README.md")]

mod cache;
mod checks;
mod clock;
mod conn;
mod error;
mod key;
mod limit;
mod limiter;
mod memory;
mod merge;
pub mod metric;
mod permit;
#[cfg(any(feature = "deadpool", feature = "bb8"))]
mod pool;
mod postgres;
mod purge;
mod sql;
mod store;
mod trace;
mod verdict;

pub use crate::cache::{DEFAULT_REFUSAL_TTL, FLOOD_REFUSALS, FLOOD_SPAN, MAX_REFUSAL_TTL};
pub use crate::clock::ManualClock;
pub use crate::conn::{Connect, Connected, LimitConn};
pub use crate::error::{BoxError, Error, ErrorKind};
pub use crate::key::{Key, MAX_KEY_BYTES};
pub use crate::limit::{
    Limit, MAX_ATTEMPTS, MAX_LOCKOUT, MAX_NAME_BYTES, MAX_WINDOW, MIN_WINDOW, OnSuccess, Strategy,
    WhenUnreachable,
};
pub use crate::limiter::{
    DEFAULT_BUDGET, DEFAULT_REFUSAL_CACHE_KEYS, Limiter, MAX_BUDGET, MAX_PAIRS, Verdicts,
};
pub use crate::memory::Memory;
pub use crate::permit::{Permit, Reservation};
#[cfg(feature = "deadpool")]
pub use crate::pool::DeadpoolConn;
pub use crate::postgres::Postgres;
pub use crate::purge::{
    MIN_PURGE_INTERVAL, PURGE_BATCH_BUDGET, PURGE_BATCH_ROWS, PurgeTask, purge,
};
pub use crate::store::Store;
pub use crate::verdict::Verdict;

/// The schema: the table `platformkit_limits`, the function
/// `platformkit_is_system()`, row-level security and its one policy, and the
/// index `purge` needs. A script that is safe to apply twice, for your own
/// migrations. PostgreSQL 14 or newer.
pub const SCHEMA: &str = sql::SCHEMA;

/// Internals exposed for the fuzz targets and property tests; not part of the
/// public API and not covered by semver.
#[doc(hidden)]
pub mod internal {
    pub use crate::key::{decode, normalize_identity};

    /// The properties the fuzz targets check, runnable on stable.
    pub mod checks {
        pub use crate::checks::*;
    }
}
