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

/// One statement ready to send: its text, and its parameters in the order
/// of its `$n`.
#[derive(Debug)]
pub(crate) struct Statement<'a, const N: usize> {
    pub(crate) sql: &'static str,
    pub(crate) params: [Param<'a>; N],
}

/// Each statement's arguments once: a struct of them, in the order of the
/// text's `$n`, each with how it is sent, and `statement()` to bind them.
macro_rules! statements {
    ($(
        $(#[$doc:meta])*
        $name:ident$(<$a:lifetime>)? = $sql:literal {
            $($(#[$field_doc:meta])* $field:ident: $ty:ty => $param:ident,)+
        }
    )+) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub(crate) struct $name$(<$a>)? {
            $($(#[$field_doc])* pub(crate) $field: $ty,)+
        }

        impl<'a> $name$(<$a>)? {
            pub(crate) fn statement(self) -> Statement<'a, { [$(stringify!($field)),+].len() }> {
                Statement {
                    sql: $sql,
                    params: [$(Param::$param(self.$field)),+],
                }
            }
        }
    )+};
}

statements! {
    /// Adds `p_add` to the key's count in the current window. Returns the
    /// count, the window's end, the time, the previous window's count, the
    /// lockout still to run (instants and spans as `int8` microseconds) and
    /// how long the commit waited.
    Add<'a> = "CALL platformkit.platformkit_limit_add(\
        p_key => $1, p_add => $2, p_window_secs => $3, p_at => $4, p_budget_ms => $5, \
        p_relaxed => $6, p_previous => $7, p_max => $8, p_lockout_secs => $9)" {
        key: &'a str => Text,
        add: i64 => Int8,
        window_secs: i64 => Int8,
        /// The pinned time in epoch microseconds; `None`: the server's clock.
        at: Option<i64> => MaybeInt8,
        budget_ms: i64 => Int8,
        relaxed: bool => Bool,
        previous: bool => Bool,
        max: i64 => Int8,
        lockout_secs: i64 => Int8,
    }

    /// Adds each pair's amount to the count of each (key, window) pair, in
    /// (key, window) order, answering arrays in the order given.
    AddMany<'a> = "CALL platformkit.platformkit_limit_add_many(\
        p_keys => $1, p_window_secs => $2, p_adds => $3, p_at => $4, p_budget_ms => $5, \
        p_relaxed => $6, p_sliding => $7, p_maxes => $8, p_lockout_secs => $9)" {
        keys: &'a [&'a str] => TextArray,
        window_secs: &'a [i64] => Int8Array,
        adds: &'a [i64] => Int8Array,
        at: Option<i64> => MaybeInt8,
        budget_ms: i64 => Int8,
        relaxed: bool => Bool,
        sliding: &'a [bool] => BoolArray,
        maxes: &'a [i64] => Int8Array,
        lockout_secs: &'a [i64] => Int8Array,
    }

    /// Reads the count of each (key, window) pair, writing nothing: one
    /// `int8[]`, the time, then each pair's count, window end, previous
    /// count and lockout still to run.
    ReadMany<'a> = "SELECT platformkit.platformkit_limit_read_many(\
        p_keys => $1, p_window_secs => $2, p_at => $3, p_budget_ms => $4, \
        p_previous => $5, p_maxes => $6, p_lockout_secs => $7)" {
        keys: &'a [&'a str] => TextArray,
        window_secs: &'a [i64] => Int8Array,
        at: Option<i64> => MaybeInt8,
        budget_ms: i64 => Int8,
        previous: bool => Bool,
        maxes: &'a [i64] => Int8Array,
        lockout_secs: &'a [i64] => Int8Array,
    }

    /// As [`ReadMany`], for one key.
    Read<'a> = "SELECT platformkit.platformkit_limit_read(\
        p_key => $1, p_window_secs => $2, p_at => $3, p_budget_ms => $4, \
        p_previous => $5, p_max => $6, p_lockout_secs => $7)" {
        key: &'a str => Text,
        window_secs: i64 => Int8,
        at: Option<i64> => MaybeInt8,
        budget_ms: i64 => Int8,
        previous: bool => Bool,
        max: i64 => Int8,
        lockout_secs: i64 => Int8,
    }

    /// The keys under `p_prefix` (a limit's name and `|`) that the limit
    /// refuses now, at most `p_at_most`, newest first; writes nothing.
    List<'a> = "SELECT * FROM platformkit.platformkit_limit_list(\
        p_prefix => $1, p_window_secs => $2, p_at => $3, p_budget_ms => $4, \
        p_previous => $5, p_max => $6, p_lockout_secs => $7, p_at_most => $8)" {
        prefix: &'a str => Text,
        window_secs: i64 => Int8,
        at: Option<i64> => MaybeInt8,
        budget_ms: i64 => Int8,
        previous: bool => Bool,
        max: i64 => Int8,
        lockout_secs: i64 => Int8,
        at_most: i64 => Int8,
    }

    /// Takes `p_n` back from the key's count in the window starting at
    /// `p_window_start`, never below zero; returns the count.
    TakeBack<'a> = "CALL platformkit.platformkit_limit_take_back(\
        p_key => $1, p_window_start => $2, p_n => $3, p_budget_ms => $4, p_relaxed => $5)" {
        key: &'a str => Text,
        /// Microseconds since the Unix epoch.
        window_start: i64 => Int8,
        n: i64 => Int8,
        budget_ms: i64 => Int8,
        relaxed: bool => Bool,
    }

    /// Deletes every window of the key but a block; returns how many went.
    Reset<'a> = "CALL platformkit.platformkit_limit_reset(\
        p_key => $1, p_budget_ms => $2, p_relaxed => $3)" {
        key: &'a str => Text,
        budget_ms: i64 => Int8,
        relaxed: bool => Bool,
    }

    /// Records a limit's definition, replacing another under its name.
    Define<'a> = "CALL platformkit.platformkit_limit_define(\
        p_name => $1, p_max => $2, p_window_secs => $3, p_sliding => $4, \
        p_lockout_secs => $5, p_budget_ms => $6)" {
        name: &'a str => Text,
        max: i64 => Int8,
        window_secs: i64 => Int8,
        sliding: bool => Bool,
        lockout_secs: i64 => Int8,
        budget_ms: i64 => Int8,
    }

    /// The limits recorded, by name: their names, and four integers a name
    /// (max, window in seconds, sliding as 0 or 1, lockout in seconds).
    Limits = "SELECT * FROM platformkit.platformkit_limit_defs(p_budget_ms => $1)" {
        budget_ms: i64 => Int8,
    }

    /// An operator's action (`block`, `unblock`, `unlock`) on the key,
    /// audited; returns how many rows went, and a block's end.
    Operate<'a> = "CALL platformkit.platformkit_limit_operate(\
        p_action => $1, p_key => $2, p_for_secs => $3, p_at => $4, \
        p_by => $5, p_reason => $6, p_budget_ms => $7)" {
        action: &'a str => Text,
        key: &'a str => Text,
        /// A block's length in seconds.
        block_secs: Option<i64> => MaybeInt8,
        at: Option<i64> => MaybeInt8,
        by: &'a str => Text,
        reason: &'a str => Text,
        budget_ms: i64 => Int8,
    }

    /// The audit, newest first: texts (by, action, key, reason) and
    /// integers (at, until or 0, windows or -1) an entry.
    Audit<'a> = "SELECT * FROM platformkit.platformkit_limit_audit_log(\
        p_prefix => $1, p_at_most => $2, p_budget_ms => $3)" {
        prefix: &'a str => Text,
        at_most: i64 => Int8,
        budget_ms: i64 => Int8,
    }
}

impl<'a> AddMany<'a> {
    /// As [`AddMany`], adding only if every pair's ask may go ahead; answers
    /// whether it added too.
    pub(crate) fn all_or_none(self) -> Statement<'a, 9> {
        Statement {
            sql: "CALL platformkit.platformkit_limit_add_all_or_none(\
                p_keys => $1, p_window_secs => $2, p_adds => $3, p_at => $4, p_budget_ms => $5, \
                p_relaxed => $6, p_sliding => $7, p_maxes => $8, p_lockout_secs => $9)",
            ..self.statement()
        }
    }
}

/// Deletes at most `batch` rows due ([`purge`](crate::purge)), skipping
/// held rows, from where the batch before stopped (`NULL` for the first);
/// returns how many went and where it stopped.
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
            sql: "CALL platformkit.platformkit_limit_purge_from(\
                p_batch => $1, p_budget_ms => $2, o_after => $3, o_created => $4)",
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
