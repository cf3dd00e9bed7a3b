//! Every SQL text the crate sends, in one place.
//!
//! `schema.sql` at the crate root is the one source of truth for the schema
//! and the limiter's procedures; it is exported as [`SCHEMA`](crate::SCHEMA).
//!
//! # One call, one statement, one round trip
//!
//! Each operation is one `CALL` of a procedure from `schema.sql`, sent in
//! autocommit with the key as a bind parameter: one message, one network
//! round trip, and plans the server caches per connection. The procedure
//! opens the limiter's own short system transaction (see `schema.sql`):
//!
//! - `COMMIT` first, which PostgreSQL refuses inside a caller's transaction
//!   block (`2D000`), so the limiter never joins, commits or leaks into a
//!   caller's transaction;
//! - `READ COMMITTED, READ WRITE` whatever the session's defaults;
//! - the system switch, the budget as `lock_timeout`, and `row_security` on,
//!   with `set_config(…, true)`: for that transaction only, which ends with
//!   the `CALL`.

/// The schema, as a script that is safe to apply twice.
pub(crate) const SCHEMA: &str = include_str!("../schema.sql");

/// Adds `$2` to the key's count in the current window.
///
/// `$1` stored key, `$2` how many to add, `$3` window in seconds, `$4` the
/// pinned time or NULL for the database's clock, `$5` budget in
/// milliseconds, `$6` relaxed durability, `$7` whether to read the previous
/// window too (sliding windows). Returns the count, the window's end, the
/// time and the previous window's count. `$8` max and `$9` lockout in
/// seconds (0 for none): it also returns when an earlier exhausted window's
/// lockout ends.
pub(crate) const ADD: &str = "CALL platformkit_limit_add($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Adds `$3` to the count of each pair of `$1` (stored keys) and `$2`
/// (windows in seconds), in (key, window) order. `$4` pinned time or NULL,
/// `$5` budget in milliseconds, `$6` relaxed durability, `$7` whether to
/// read the previous windows. Returns the counts and window ends in the
/// order given, the time, and the previous counts.
pub(crate) const ADD_MANY: &str =
    "CALL platformkit_limit_add_many($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Reads the count of each pair of `$1` and `$2`. `$3` pinned time or NULL,
/// `$4` budget in milliseconds, `$5` whether to read the previous windows.
pub(crate) const READ_MANY: &str = "CALL platformkit_limit_read_many($1, $2, $3, $4, $5, $6, $7)";

/// Reads the key's count in the current window; writes nothing.
///
/// `$1` stored key, `$2` window in seconds, `$3` the pinned time or NULL,
/// `$4` budget in milliseconds, `$5` whether to read the previous window,
/// `$6` max, `$7` lockout in seconds. Returns the count, the window's end,
/// the time, the previous count and the end of a lockout.
pub(crate) const READ: &str = "CALL platformkit_limit_read($1, $2, $3, $4, $5, $6, $7)";

/// Takes `$3` back from the key's count in the window starting at `$2`,
/// never below zero. `$1` stored key, `$4` budget in milliseconds, `$5`
/// relaxed durability. Returns the count.
pub(crate) const TAKE_BACK: &str = "CALL platformkit_limit_take_back($1, $2, $3, $4, $5)";

/// Deletes every window of the key. `$1` stored key, `$2` budget in
/// milliseconds, `$3` relaxed durability. Returns how many rows went.
pub(crate) const RESET: &str = "CALL platformkit_limit_reset($1, $2, $3)";

/// Deletes at most `$1` rows whose window closed more than 24 hours ago.
/// `$2` budget in milliseconds. Returns how many rows went.
pub(crate) const PURGE_BATCH: &str = "CALL platformkit_limit_purge($1, $2)";

/// The budget as the server takes it: whole milliseconds, at least 1 (0
/// would mean no limit).
pub(crate) fn budget_ms(budget: std::time::Duration) -> i64 {
    i64::try_from(budget.as_millis().max(1)).unwrap_or(i64::MAX)
}
