//! Every SQL text the crate sends, in one place.
//!
//! `schema.sql` at the crate root is the one source of truth for the schema;
//! it is exported as [`SCHEMA`](crate::SCHEMA).
//!
//! # The limiter's system transaction
//!
//! Every call sends three messages at once, without waiting in between
//! (pipelined: one network round trip on an idle connection):
//!
//! 1. a simple query, [`begin`]: `BEGIN` with the isolation and access mode
//!    the statement needs whatever the session's defaults, the remaining
//!    budget as `statement_timeout` and `lock_timeout`, `row_security` on,
//!    and the guard, which turns the system switch on for this transaction
//!    only, or fails when the connection was already inside a transaction;
//! 2. the one statement, with the key as a bind parameter;
//! 3. `COMMIT`.
//!
//! If the guard fails, the statement fails too (the transaction is aborted)
//! and `COMMIT` rolls back: the limiter never commits a caller's work.

use std::fmt::Write as _;
use std::time::Duration;

/// The schema, as a script that is safe to apply twice.
pub(crate) const SCHEMA: &str = include_str!("../schema.sql");

/// The custom setting that is the system switch.
pub(crate) const SYSTEM_SWITCH: &str = "platformkit.system";

/// The name of the setting the guard reads to fail. It does not exist, so
/// reading it raises `42704 undefined_object` naming it, which
/// [`is_guard_error`] recognises.
const GUARD_MARKER: &str = "platformkit.limiter_was_handed_a_connection_inside_a_transaction";

/// Whether the limiter's transaction commits without waiting for its WAL
/// flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Durability {
    /// Wait for the flush (`synchronous_commit` as the server has it).
    #[default]
    Durable,
    /// `synchronous_commit = off` for the limiter's transaction only.
    Relaxed,
}

/// The first message of the limiter's transaction (see the module docs).
///
/// `budget` is the time left; it is sent in whole milliseconds, at least 1.
pub(crate) fn begin(budget: Duration, durability: Durability) -> String {
    let ms = budget.as_millis().clamp(1, i32::MAX as u128);
    let mut sql = String::with_capacity(512);
    sql.push_str("BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE;");
    // The guard comes first. statement_timestamp() is the receipt of this
    // message; transaction_timestamp() equals it exactly only when this
    // message started the transaction.
    let _ = write!(
        sql,
        "SELECT CASE WHEN pg_catalog.transaction_timestamp() = pg_catalog.statement_timestamp() \
         THEN pg_catalog.set_config('{SYSTEM_SWITCH}', 'on', true) \
         ELSE pg_catalog.current_setting('{GUARD_MARKER}') END;"
    );
    let _ = write!(
        sql,
        "SET LOCAL statement_timeout = {ms};SET LOCAL lock_timeout = {ms};\
         SET LOCAL row_security = on;"
    );
    if durability == Durability::Relaxed {
        sql.push_str("SET LOCAL synchronous_commit = off;");
    }
    sql
}

/// The last message of the limiter's transaction.
pub(crate) const COMMIT: &str = "COMMIT";

/// Whether an error is the guard's: the connection was inside a transaction.
pub(crate) fn is_guard_error(error: &tokio_postgres::Error) -> bool {
    error
        .as_db_error()
        .is_some_and(|db| db.message().contains(GUARD_MARKER))
}

// The window arithmetic below uses only microsecond intervals added to
// timestamptz values, and date_bin from the Unix epoch: none of it depends on
// the session's TimeZone or DateStyle.

/// Adds `$2` to the key's count in the current window and returns the count,
/// the window's end and the time.
///
/// `$1` stored key, `$2` how many to add, `$3` window in seconds, `$4` the
/// pinned time or NULL for the database's clock. The addition saturates at
/// the largest `bigint`, so no count can overflow.
pub(crate) const ADD: &str = "\
WITH clock AS (
    SELECT COALESCE($4::timestamptz, pg_catalog.statement_timestamp()) AS now
), win AS (
    SELECT now,
           pg_catalog.date_bin($3::int8 * interval '1 second', now,
                               timestamptz '1970-01-01 00:00:00+00') AS start
    FROM clock
)
INSERT INTO platformkit_limits AS l (key, window_start, window_end, count)
SELECT $1::text, win.start, win.start + $3::int8 * interval '1 second', $2::int8
FROM win
ON CONFLICT (key, window_start) DO UPDATE
    SET count = l.count + LEAST(excluded.count, 9223372036854775807 - l.count)
RETURNING l.count, l.window_end, (SELECT now FROM clock)";

/// Reads the key's count in the current window; writes nothing.
///
/// `$1` stored key, `$2` window in seconds, `$3` the pinned time or NULL.
pub(crate) const READ: &str = "\
WITH clock AS (
    SELECT COALESCE($3::timestamptz, pg_catalog.statement_timestamp()) AS now
), win AS (
    SELECT now,
           pg_catalog.date_bin($2::int8 * interval '1 second', now,
                               timestamptz '1970-01-01 00:00:00+00') AS start
    FROM clock
)
SELECT COALESCE((SELECT l.count FROM platformkit_limits AS l
                 WHERE l.key = $1::text AND l.window_start = win.start), 0::int8),
       win.start + $2::int8 * interval '1 second',
       win.now
FROM win";

/// Deletes every window of the key. `$1` stored key.
pub(crate) const RESET: &str = "DELETE FROM platformkit_limits WHERE key = $1::text";

/// Deletes at most `$1` rows whose window closed more than 24 hours ago,
/// skipping rows another transaction holds.
pub(crate) const PURGE_BATCH: &str = "\
DELETE FROM platformkit_limits AS l
USING (
    SELECT key, window_start FROM platformkit_limits
    WHERE window_end < pg_catalog.statement_timestamp() - interval '24 hours'
    LIMIT $1::int8
    FOR UPDATE SKIP LOCKED
) AS doomed
WHERE l.key = doomed.key AND l.window_start = doomed.window_start";
