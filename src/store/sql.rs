//! Every SQL text the crate sends, each argument named (`p_key => $1`),
//! and its arguments; the routines are in `schema.sql`
//! ([`SCHEMA`](crate::SCHEMA)). Why one statement, and what each routine
//! does first: [one call's path](crate::guide#one-calls-path),
//! [the procedures' prologue](crate::guide#the-procedures-prologue).

use snafu::ensure;

use crate::Error;
use crate::driver::Param;
use crate::error::InvalidOptionSnafu;

/// The schema, as a script that is safe to apply twice.
pub(crate) const SCHEMA: &str = include_str!("../../schema.sql");

/// The version of [`SCHEMA`] (`platformkit.platformkit_schema_version()`),
/// raised whenever a release changes `schema.sql`.
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// Adds `p_add` to the key's count in the current window. Returns the count,
/// the window's end, the time, the previous window's count and the lockout
/// still to run, instants and spans as `int8` microseconds.
pub(crate) const ADD: &str = "CALL platformkit.platformkit_limit_add(\
    p_key => $1, p_add => $2, p_window_secs => $3, p_at => $4, p_budget_ms => $5, \
    p_relaxed => $6, p_previous => $7, p_max => $8, p_lockout_secs => $9)";

/// Adds each pair's amount (`p_adds`) to the count of each (key, window)
/// pair, in (key, window) order. Returns arrays in the order given.
pub(crate) const ADD_MANY: &str = "CALL platformkit.platformkit_limit_add_many(\
    p_keys => $1, p_window_secs => $2, p_adds => $3, p_at => $4, p_budget_ms => $5, \
    p_relaxed => $6, p_sliding => $7, p_maxes => $8, p_lockout_secs => $9)";

/// Adds each pair's amount (`p_adds`) to the count of each (key, window)
/// pair only if every pair's ask may go ahead. Returns arrays in the order
/// given, and whether the amounts were added.
pub(crate) const ADD_ALL_OR_NONE: &str = "CALL platformkit.platformkit_limit_add_all_or_none(\
    p_keys => $1, p_window_secs => $2, p_adds => $3, p_at => $4, p_budget_ms => $5, \
    p_relaxed => $6, p_sliding => $7, p_maxes => $8, p_lockout_secs => $9)";

/// Reads the count of each (key, window) pair; writes nothing. Answers one
/// `int8[]`: the time, then each pair's count, window end, previous count
/// and lockout still to run (instants and spans in microseconds).
pub(crate) const READ_MANY: &str = "SELECT platformkit.platformkit_limit_read_many(\
    p_keys => $1, p_window_secs => $2, p_at => $3, p_budget_ms => $4, \
    p_previous => $5, p_maxes => $6, p_lockout_secs => $7)";

/// Reads the key's count in the current window; writes nothing. Answers as
/// [`READ_MANY`] does for one pair.
pub(crate) const READ: &str = "SELECT platformkit.platformkit_limit_read(\
    p_key => $1, p_window_secs => $2, p_at => $3, p_budget_ms => $4, \
    p_previous => $5, p_max => $6, p_lockout_secs => $7)";

/// Lists the keys under `p_prefix` (a limit's name and `|`) that the limit
/// refuses now, at most `p_at_most`, newest first; writes nothing.
pub(crate) const LIST: &str = "SELECT * FROM platformkit.platformkit_limit_list(\
    p_prefix => $1, p_window_secs => $2, p_at => $3, p_budget_ms => $4, \
    p_previous => $5, p_max => $6, p_lockout_secs => $7, p_at_most => $8)";

/// Takes `p_n` back from the key's count in the window starting at
/// `p_window_start`, never below zero. Returns the count.
pub(crate) const TAKE_BACK: &str = "CALL platformkit.platformkit_limit_take_back(\
    p_key => $1, p_window_start => $2, p_n => $3, p_budget_ms => $4, p_relaxed => $5)";

/// Records a limit's definition, replacing another under its name.
pub(crate) const DEFINE: &str = "CALL platformkit.platformkit_limit_define(\
    p_name => $1, p_max => $2, p_window_secs => $3, p_sliding => $4, \
    p_lockout_secs => $5, p_budget_ms => $6)";

/// The limits recorded, by name: their names, and four integers a name
/// (max, window in seconds, sliding as 0 or 1, lockout in seconds).
pub(crate) const LIMITS: &str =
    "SELECT * FROM platformkit.platformkit_limit_defs(p_budget_ms => $1)";

/// An operator's action (`block`, `unblock`, `unlock`) on the key,
/// audited. Returns how many rows went, and a block's end.
pub(crate) const OPERATE: &str = "CALL platformkit.platformkit_limit_operate(\
    p_action => $1, p_key => $2, p_for_secs => $3, p_at => $4, \
    p_by => $5, p_reason => $6, p_budget_ms => $7)";

/// The audit, newest first: texts (by, action, key, reason) and integers
/// (at, until or 0, windows or -1) an entry.
pub(crate) const AUDIT: &str = "SELECT * FROM platformkit.platformkit_limit_audit_log(\
    p_prefix => $1, p_at_most => $2, p_budget_ms => $3)";

/// Deletes every window of the key but a block. Returns how many rows went.
pub(crate) const RESET: &str = "CALL platformkit.platformkit_limit_reset(\
    p_key => $1, p_budget_ms => $2, p_relaxed => $3)";

/// Deletes at most `p_batch` rows due ([`purge`](crate::purge)), skipping
/// held rows, from where the batch before stopped (`o_after`, `o_created`;
/// `NULL` for the first). Returns how many went and where it stopped.
pub(crate) const PURGE_BATCH: &str = "CALL platformkit.platformkit_limit_purge_from(\
    p_batch => $1, p_budget_ms => $2, o_after => $3, o_created => $4)";

/// One statement ready to send: its text, and its parameters in the order
/// of its `$n`, written once in each arguments struct below.
#[derive(Debug)]
pub(crate) struct Statement<'a, const N: usize> {
    pub(crate) sql: &'static str,
    pub(crate) params: [Param<'a>; N],
}

/// The arguments of [`ADD`].
#[derive(Debug)]
pub(crate) struct Add<'a> {
    pub(crate) key: &'a str,
    pub(crate) add: i64,
    pub(crate) window_secs: i64,
    /// The pinned time in epoch microseconds; `None`: the server's clock.
    pub(crate) at: Option<i64>,
    pub(crate) budget_ms: i64,
    pub(crate) relaxed: bool,
    pub(crate) previous: bool,
    pub(crate) max: i64,
    pub(crate) lockout_secs: i64,
}

impl<'a> Add<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 9> {
        Statement {
            sql: ADD,
            params: [
                Param::Text(self.key),
                Param::Int8(self.add),
                Param::Int8(self.window_secs),
                Param::MaybeInt8(self.at),
                Param::Int8(self.budget_ms),
                Param::Bool(self.relaxed),
                Param::Bool(self.previous),
                Param::Int8(self.max),
                Param::Int8(self.lockout_secs),
            ],
        }
    }
}

/// The arguments of [`READ`].
#[derive(Debug)]
pub(crate) struct Read<'a> {
    pub(crate) key: &'a str,
    pub(crate) window_secs: i64,
    pub(crate) at: Option<i64>,
    pub(crate) budget_ms: i64,
    pub(crate) previous: bool,
    pub(crate) max: i64,
    pub(crate) lockout_secs: i64,
}

impl<'a> Read<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 7> {
        Statement {
            sql: READ,
            params: [
                Param::Text(self.key),
                Param::Int8(self.window_secs),
                Param::MaybeInt8(self.at),
                Param::Int8(self.budget_ms),
                Param::Bool(self.previous),
                Param::Int8(self.max),
                Param::Int8(self.lockout_secs),
            ],
        }
    }
}

/// The arguments of [`LIST`].
#[derive(Debug)]
pub(crate) struct List<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) window_secs: i64,
    pub(crate) at: Option<i64>,
    pub(crate) budget_ms: i64,
    pub(crate) previous: bool,
    pub(crate) max: i64,
    pub(crate) lockout_secs: i64,
    pub(crate) at_most: i64,
}

impl<'a> List<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 8> {
        Statement {
            sql: LIST,
            params: [
                Param::Text(self.prefix),
                Param::Int8(self.window_secs),
                Param::MaybeInt8(self.at),
                Param::Int8(self.budget_ms),
                Param::Bool(self.previous),
                Param::Int8(self.max),
                Param::Int8(self.lockout_secs),
                Param::Int8(self.at_most),
            ],
        }
    }
}

/// The arguments of [`ADD_MANY`].
#[derive(Debug)]
pub(crate) struct AddMany<'a> {
    pub(crate) keys: &'a [&'a str],
    pub(crate) window_secs: &'a [i64],
    pub(crate) adds: &'a [i64],
    pub(crate) at: Option<i64>,
    pub(crate) budget_ms: i64,
    pub(crate) relaxed: bool,
    pub(crate) sliding: &'a [bool],
    pub(crate) maxes: &'a [i64],
    pub(crate) lockout_secs: &'a [i64],
}

impl<'a> AddMany<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 9> {
        Statement {
            sql: ADD_MANY,
            params: [
                Param::TextArray(self.keys),
                Param::Int8Array(self.window_secs),
                Param::Int8Array(self.adds),
                Param::MaybeInt8(self.at),
                Param::Int8(self.budget_ms),
                Param::Bool(self.relaxed),
                Param::BoolArray(self.sliding),
                Param::Int8Array(self.maxes),
                Param::Int8Array(self.lockout_secs),
            ],
        }
    }
}

/// The arguments of [`ADD_ALL_OR_NONE`].
#[derive(Debug)]
pub(crate) struct AddAllOrNone<'a> {
    pub(crate) keys: &'a [&'a str],
    pub(crate) window_secs: &'a [i64],
    pub(crate) adds: &'a [i64],
    pub(crate) at: Option<i64>,
    pub(crate) budget_ms: i64,
    pub(crate) relaxed: bool,
    pub(crate) sliding: &'a [bool],
    pub(crate) maxes: &'a [i64],
    pub(crate) lockout_secs: &'a [i64],
}

impl<'a> AddAllOrNone<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 9> {
        Statement {
            sql: ADD_ALL_OR_NONE,
            params: [
                Param::TextArray(self.keys),
                Param::Int8Array(self.window_secs),
                Param::Int8Array(self.adds),
                Param::MaybeInt8(self.at),
                Param::Int8(self.budget_ms),
                Param::Bool(self.relaxed),
                Param::BoolArray(self.sliding),
                Param::Int8Array(self.maxes),
                Param::Int8Array(self.lockout_secs),
            ],
        }
    }
}

/// The arguments of [`READ_MANY`].
#[derive(Debug)]
pub(crate) struct ReadMany<'a> {
    pub(crate) keys: &'a [&'a str],
    pub(crate) window_secs: &'a [i64],
    pub(crate) at: Option<i64>,
    pub(crate) budget_ms: i64,
    pub(crate) previous: bool,
    pub(crate) maxes: &'a [i64],
    pub(crate) lockout_secs: &'a [i64],
}

impl<'a> ReadMany<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 7> {
        Statement {
            sql: READ_MANY,
            params: [
                Param::TextArray(self.keys),
                Param::Int8Array(self.window_secs),
                Param::MaybeInt8(self.at),
                Param::Int8(self.budget_ms),
                Param::Bool(self.previous),
                Param::Int8Array(self.maxes),
                Param::Int8Array(self.lockout_secs),
            ],
        }
    }
}

/// The arguments of [`TAKE_BACK`].
#[derive(Debug)]
pub(crate) struct TakeBack<'a> {
    pub(crate) key: &'a str,
    /// Microseconds since the Unix epoch.
    pub(crate) window_start: i64,
    pub(crate) n: i64,
    pub(crate) budget_ms: i64,
    pub(crate) relaxed: bool,
}

impl<'a> TakeBack<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 5> {
        Statement {
            sql: TAKE_BACK,
            params: [
                Param::Text(self.key),
                Param::Int8(self.window_start),
                Param::Int8(self.n),
                Param::Int8(self.budget_ms),
                Param::Bool(self.relaxed),
            ],
        }
    }
}

/// The arguments of [`RESET`].
#[derive(Debug)]
pub(crate) struct Reset<'a> {
    pub(crate) key: &'a str,
    pub(crate) budget_ms: i64,
    pub(crate) relaxed: bool,
}

impl<'a> Reset<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 3> {
        Statement {
            sql: RESET,
            params: [
                Param::Text(self.key),
                Param::Int8(self.budget_ms),
                Param::Bool(self.relaxed),
            ],
        }
    }
}

/// The arguments of [`DEFINE`].
#[derive(Debug)]
pub(crate) struct Define<'a> {
    pub(crate) name: &'a str,
    pub(crate) max: i64,
    pub(crate) window_secs: i64,
    pub(crate) sliding: bool,
    pub(crate) lockout_secs: i64,
    pub(crate) budget_ms: i64,
}

impl<'a> Define<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 6> {
        Statement {
            sql: DEFINE,
            params: [
                Param::Text(self.name),
                Param::Int8(self.max),
                Param::Int8(self.window_secs),
                Param::Bool(self.sliding),
                Param::Int8(self.lockout_secs),
                Param::Int8(self.budget_ms),
            ],
        }
    }
}

/// The arguments of [`LIMITS`].
#[derive(Debug)]
pub(crate) struct Limits {
    pub(crate) budget_ms: i64,
}

impl Limits {
    pub(crate) fn statement(self) -> Statement<'static, 1> {
        Statement {
            sql: LIMITS,
            params: [Param::Int8(self.budget_ms)],
        }
    }
}

/// The arguments of [`OPERATE`].
#[derive(Debug)]
pub(crate) struct Operate<'a> {
    pub(crate) action: &'a str,
    pub(crate) key: &'a str,
    /// A block's length in seconds.
    pub(crate) block_secs: Option<i64>,
    pub(crate) at: Option<i64>,
    pub(crate) by: &'a str,
    pub(crate) reason: &'a str,
    pub(crate) budget_ms: i64,
}

impl<'a> Operate<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 7> {
        Statement {
            sql: OPERATE,
            params: [
                Param::Text(self.action),
                Param::Text(self.key),
                Param::MaybeInt8(self.block_secs),
                Param::MaybeInt8(self.at),
                Param::Text(self.by),
                Param::Text(self.reason),
                Param::Int8(self.budget_ms),
            ],
        }
    }
}

/// The arguments of [`AUDIT`].
#[derive(Debug)]
pub(crate) struct Audit<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) at_most: i64,
    pub(crate) budget_ms: i64,
}

impl<'a> Audit<'a> {
    pub(crate) fn statement(self) -> Statement<'a, 3> {
        Statement {
            sql: AUDIT,
            params: [
                Param::Text(self.prefix),
                Param::Int8(self.at_most),
                Param::Int8(self.budget_ms),
            ],
        }
    }
}

/// The arguments of [`PURGE_BATCH`].
#[derive(Debug)]
pub(crate) struct PurgeBatch {
    pub(crate) batch: i64,
    pub(crate) budget_ms: i64,
    pub(crate) from: Option<PurgePlace>,
}

/// Where a purge batch stopped (`purge_after`, `created_at`, in epoch
/// seconds): where the next batch starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PurgePlace {
    pub(crate) after: f64,
    pub(crate) created: f64,
}

impl PurgeBatch {
    pub(crate) fn statement(&self) -> Statement<'static, 4> {
        Statement {
            sql: PURGE_BATCH,
            params: [
                Param::Int8(self.batch),
                Param::Int8(self.budget_ms),
                Param::Float8(self.from.map(|place| place.after)),
                Param::Float8(self.from.map(|place| place.created)),
            ],
        }
    }
}

/// The times a clock may be pinned to, in microseconds since the Unix
/// epoch: 1900-01-01 UTC up to 2200-01-01 UTC, as the procedures check.
pub(crate) const PINNED_MICROS: std::ops::Range<i64> =
    -2_208_988_800_000_000..7_258_118_400_000_000;

/// The statements that give `role` what the limiter needs and nothing more
/// ([the schema](crate::guide#the-schema)). Run them as the schema's owner
/// after applying [`SCHEMA`](crate::SCHEMA), and after each newer version.
///
/// ```
/// use platformkit_limit::{ErrorKind, grants};
///
/// assert_eq!(
///     grants("app")?,
///     "GRANT USAGE ON SCHEMA platformkit TO \"app\";\n\
///      GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA platformkit TO \"app\";\n\
///      GRANT EXECUTE ON ALL ROUTINES IN SCHEMA platformkit TO \"app\";\n"
/// );
/// // PostgreSQL reads `public`, quoted or not, as PUBLIC: every login.
/// assert_eq!(grants("Public").unwrap_err().kind(), ErrorKind::InvalidOption);
/// # Ok::<(), platformkit_limit::Error>(())
/// ```
///
/// # Errors
///
/// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) for an
/// empty name, and for `public` in any case, which PostgreSQL reads as
/// every login: it would hand every login the limiter's powers.
pub fn grants(role: &str) -> Result<String, Error> {
    ensure!(
        !role.is_empty() && !role.eq_ignore_ascii_case("public"),
        InvalidOptionSnafu {
            option: "role",
            reason: format!(
                "{role:?} is not a role: PostgreSQL reads public as every login (PUBLIC)"
            ),
        }
    );
    let role = format!("\"{}\"", role.replace('"', "\"\""));
    Ok(format!(
        "GRANT USAGE ON SCHEMA platformkit TO {role};\n\
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA platformkit TO {role};\n\
         GRANT EXECUTE ON ALL ROUTINES IN SCHEMA platformkit TO {role};\n"
    ))
}
