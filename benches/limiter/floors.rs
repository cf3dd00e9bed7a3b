//! The floors: each procedure's statement alone, the best it can do.
//!
//! The statement of `platformkit.platformkit_limit_add` (the upsert of every
//! `failed` and `hit`) and of `platformkit.platformkit_limit_read` (the read
//! of `check`) is cut out of [`SCHEMA`](platformkit_limit::SCHEMA) at run
//! time, from between the procedure's `-- statement` and
//! `-- end of statement`: the floor is the text the procedure runs, not a
//! copy of it. Each PL/pgSQL variable the statement names (a parameter, a
//! declared variable) becomes a bind parameter of the type the procedure
//! declares it with, which is how PL/pgSQL itself runs the statement; the
//! closing `INTO …` goes.
//!
//! The statement is then prepared once per connection and run with
//! `query_one` (Bind, Execute, Sync: one round trip) in autocommit, as a
//! driver would run it: no parse or plan per call, and the window, the time
//! and the window's start bound from the client rather than worked out in
//! PL/pgSQL. Nothing of the procedure around it is paid: no `CALL`, no
//! prologue, no second `COMMIT`.
//!
//! The run stops before anything is measured if the markers are missing or
//! doubled, if the statement names a variable the bench has no value for or
//! declares one with a type the bench does not bind, or if the prepared
//! statement returns other than as many columns as its `INTO` has targets.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};
use postgres_types::{IsNull, ToSql, Type, to_sql_checked};
use serde::Serialize;
use tokio_postgres::{Client, Statement};

use platformkit_limit::Limit;

use crate::LIMIT_NAME;
use crate::operations::{Held, Op};

/// The marker lines around a procedure's statement in `schema.sql`.
const BEGIN: &str = "-- statement\n";
const END: &str = "-- end of statement\n";

/// A variable of a procedure that its statement may name, and the value the
/// bench binds for it: what the limiter sends for a `failed`, `hit` or
/// `check` of the bench's limit (a fixed window, no lockout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Var {
    Key,
    Add,
    WindowSecs,
    At,
    Previous,
    Max,
    LockoutSecs,
    Window,
    Start,
    Now,
}

impl Var {
    fn named(name: &str) -> Option<Var> {
        Some(match name {
            "p_key" => Var::Key,
            "p_add" => Var::Add,
            "p_window_secs" => Var::WindowSecs,
            "p_at" => Var::At,
            "p_previous" => Var::Previous,
            "p_max" => Var::Max,
            "p_lockout_secs" => Var::LockoutSecs,
            "v_window" => Var::Window,
            "v_start" => Var::Start,
            "v_now" => Var::Now,
            _ => return None,
        })
    }

    /// The type the bench binds it as.
    fn ty(self) -> Type {
        match self {
            Var::Key => Type::TEXT,
            Var::Add | Var::WindowSecs | Var::Max | Var::LockoutSecs => Type::INT8,
            Var::Previous => Type::BOOL,
            Var::Window => Type::INTERVAL,
            Var::At | Var::Start | Var::Now => Type::TIMESTAMPTZ,
        }
    }
}

/// The SQL type a procedure declares, as a Rust-side type, if the bench
/// knows it.
fn sql_type(declared: &str) -> Option<Type> {
    Some(match declared.trim().trim_start_matches("pg_catalog.") {
        "text" => Type::TEXT,
        "bigint" | "int8" => Type::INT8,
        "boolean" | "bool" => Type::BOOL,
        "interval" => Type::INTERVAL,
        "timestamptz" | "timestamp with time zone" => Type::TIMESTAMPTZ,
        _ => return None,
    })
}

/// One procedure's statement, ready to prepare.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FloorStatement {
    /// The procedure it was cut from.
    pub(crate) procedure: String,
    /// The statement with `$n` for each variable, as prepared.
    pub(crate) sql: String,
    /// The variables bound as `$1`, `$2`, …
    pub(crate) parameters: Vec<String>,
    #[serde(skip)]
    vars: Vec<Var>,
    /// How many targets its `INTO` had: the columns it must return.
    #[serde(skip)]
    columns: usize,
}

impl FloorStatement {
    /// Cuts the statement of `platformkit.<procedure>` out of `schema`.
    /// Panics, saying what is wrong, if it cannot.
    fn cut(schema: &str, procedure: &str) -> FloorStatement {
        let fail = |why: String| -> ! {
            panic!(
                "the floor of {procedure} cannot be cut out of schema.sql: {why}; the bench \
                 runs the procedure's statement alone (benches/limiter/floors.rs)"
            )
        };
        let heads = [
            format!("CREATE OR REPLACE PROCEDURE platformkit.{procedure}("),
            format!("CREATE OR REPLACE FUNCTION platformkit.{procedure}("),
        ];
        let Some((at, head)) = heads
            .iter()
            .find_map(|head| schema.find(head.as_str()).map(|at| (at, head)))
        else {
            fail("no such procedure or function".to_owned())
        };
        let text = &schema[at + head.len()..];
        let Some(body_end) = text.find("\nEND\n$$;") else {
            fail("no end of its body".to_owned())
        };
        let text = &text[..body_end];

        // Its variables and their declared types: the parameters, then
        // the DECLARE block.
        let Some(params_end) = text.find(")\nLANGUAGE plpgsql") else {
            fail("no end of its parameter list".to_owned())
        };
        let mut declared: Vec<(String, String)> = text[..params_end]
            .split(',')
            .map(|p| {
                let p = p.trim();
                let p = p.split(" DEFAULT ").next().unwrap_or(p);
                let p = p.strip_prefix("INOUT ").unwrap_or(p);
                let p = p.strip_prefix("OUT ").unwrap_or(p);
                let (name, ty) = p.split_once(' ').unwrap_or((p, ""));
                (name.to_owned(), ty.to_owned())
            })
            .collect();
        if let (Some(d), Some(b)) = (text.find("\nDECLARE\n"), text.find("\nBEGIN\n")) {
            for line in text[d + "\nDECLARE\n".len()..b].lines() {
                if let Some((name, ty)) = line.trim().trim_end_matches(';').split_once(' ') {
                    declared.push((name.to_owned(), ty.to_owned()));
                }
            }
        }

        let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
            fail(format!(
                "no `{}` … `{}` in its body",
                BEGIN.trim(),
                END.trim()
            ))
        };
        if text.matches(BEGIN).count() != 1 || text.matches(END).count() != 1 || end < begin {
            fail("its statement markers are doubled or out of order".to_owned())
        }
        let marked = text[begin + BEGIN.len()..end].trim_end();
        // The last line is PL/pgSQL's INTO, which names where the row goes.
        let Some((statement, into)) = marked.rsplit_once('\n') else {
            fail("one line between the markers".to_owned())
        };
        let Some(targets) = into.trim().strip_prefix("INTO ") else {
            fail(format!("the last marked line is not its INTO: {into:?}"))
        };
        let columns = targets.trim_end_matches(';').split(',').count();
        if statement.contains(';') {
            fail("more than one statement between the markers".to_owned())
        }

        let (sql, names) = bind_variables(&dedent(statement), &declared);
        let vars = names
            .iter()
            .map(|name| {
                let Some(var) = Var::named(name) else {
                    fail(format!("it names {name}, which the bench has no value for"))
                };
                let declared_as = declared
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or("", |(_, ty)| ty.as_str());
                if sql_type(declared_as).as_ref() != Some(&var.ty()) {
                    fail(format!(
                        "{name} is declared {declared_as:?}; the bench binds it as {}",
                        var.ty()
                    ))
                }
                var
            })
            .collect();
        FloorStatement {
            procedure: format!("platformkit.{procedure}"),
            sql,
            parameters: names,
            vars,
            columns,
        }
    }

    /// Prepares it on `client`, with the types the procedure declares.
    async fn prepare(&self, client: &Client) -> Statement {
        let types: Vec<Type> = self.vars.iter().map(|v| v.ty()).collect();
        let statement = client
            .prepare_typed(&self.sql, &types)
            .await
            .unwrap_or_else(|e| panic!("preparing the statement of {}: {e}", self.procedure));
        assert_eq!(
            statement.columns().len(),
            self.columns,
            "the statement of {} returns other than its INTO's targets",
            self.procedure
        );
        statement
    }
}

/// `text` without the indentation its lines share.
fn dedent(text: &str) -> String {
    let indent = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.len() - line.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|line| line.get(indent..).unwrap_or(line.trim_start()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Replaces each of the `declared` variables that `statement` names (a word
/// not qualified by a table, outside quotes) with `$n`, numbered in the
/// order they first appear; drops comments. Returns the text and the
/// variables' names in parameter order.
fn bind_variables(statement: &str, declared: &[(String, String)]) -> (String, Vec<String>) {
    let mut out = String::with_capacity(statement.len());
    let mut names: Vec<String> = Vec::new();
    let mut rest = statement;
    while let Some(c) = rest.chars().next() {
        if c == '\'' {
            let close = rest[1..].find('\'').map_or(rest.len(), |i| i + 2);
            out.push_str(&rest[..close]);
            rest = &rest[close..];
        } else if rest.starts_with("--") {
            rest = &rest[rest.find('\n').unwrap_or(rest.len())..];
        } else if c.is_ascii_alphabetic() || c == '_' {
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let word = &rest[..len];
            let qualified = out.ends_with('.');
            if !qualified && declared.iter().any(|(name, _)| name == word) {
                let n = match names.iter().position(|name| name == word) {
                    Some(i) => i + 1,
                    None => {
                        names.push(word.to_owned());
                        names.len()
                    }
                };
                out.push_str(&format!("${n}"));
            } else {
                out.push_str(word);
            }
            rest = &rest[len..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    (out, names)
}

/// The two floors' statements, cut out of the schema once.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Floors {
    /// `platformkit_limit_add`'s upsert: the floor of `failed` and `hit`.
    pub(crate) upsert: FloorStatement,
    /// `platformkit_limit_read`'s read: the floor of `check`.
    pub(crate) read: FloorStatement,
}

impl Floors {
    pub(crate) fn from_schema(schema: &str) -> Floors {
        Floors {
            upsert: FloorStatement::cut(schema, "platformkit_limit_add"),
            read: FloorStatement::cut(schema, "platformkit_limit_read"),
        }
    }
}

impl fmt::Display for Floors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "floors: the statements of {} and {}, cut from SCHEMA between `{}` and `{}`, \
             prepared on each connection",
            self.upsert.procedure,
            self.read.procedure,
            BEGIN.trim(),
            END.trim()
        )?;
        for floor in [&self.upsert, &self.read] {
            let binds: Vec<String> = floor
                .parameters
                .iter()
                .enumerate()
                .map(|(i, name)| format!("${} = {name}", i + 1))
                .collect();
            write!(f, "\n  {}: {}", floor.procedure, binds.join(", "))?;
        }
        Ok(())
    }
}

/// The floors prepared on one held connection.
#[derive(Clone)]
pub(crate) struct Prepared {
    upsert: (Statement, Arc<[Var]>),
    read: (Statement, Arc<[Var]>),
}

impl Prepared {
    pub(crate) async fn on(client: &Client, floors: &Floors) -> Prepared {
        Prepared {
            upsert: (
                floors.upsert.prepare(client).await,
                floors.upsert.vars.clone().into(),
            ),
            read: (
                floors.read.prepare(client).await,
                floors.read.vars.clone().into(),
            ),
        }
    }
}

/// An interval of whole microseconds, in PostgreSQL's binary format.
#[derive(Clone, Copy, Debug)]
struct Interval {
    micros: i64,
}

impl ToSql for Interval {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.put_i64(self.micros);
        out.put_i32(0); // days
        out.put_i32(0); // months
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INTERVAL
    }

    to_sql_checked!();
}

/// What the limiter sends for one call on the bench's limit, and what the
/// procedure works out before its statement: the window, its start and the
/// time, here from the client's clock (the server's, on the same machine).
struct Values {
    key: String,
    add: i64,
    window_secs: i64,
    at: Option<SystemTime>,
    previous: bool,
    max: i64,
    lockout_secs: i64,
    window: Interval,
    start: SystemTime,
    now: SystemTime,
}

impl Values {
    fn new(id: &str, window_secs: i64) -> Values {
        let now = SystemTime::now();
        let secs = now
            .duration_since(UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_secs();
        let window = u64::try_from(window_secs).expect("a window is positive");
        Values {
            key: format!("{LIMIT_NAME}|id|{id}"),
            add: 1,
            window_secs,
            at: None,
            previous: false,
            max: i64::from(Limit::MAX_ATTEMPTS),
            lockout_secs: 0,
            window: Interval {
                micros: window_secs * 1_000_000,
            },
            start: UNIX_EPOCH + Duration::from_secs(secs - secs % window),
            now,
        }
    }

    fn get(&self, var: Var) -> &(dyn ToSql + Sync) {
        match var {
            Var::Key => &self.key,
            Var::Add => &self.add,
            Var::WindowSecs => &self.window_secs,
            Var::At => &self.at,
            Var::Previous => &self.previous,
            Var::Max => &self.max,
            Var::LockoutSecs => &self.lockout_secs,
            Var::Window => &self.window,
            Var::Start => &self.start,
            Var::Now => &self.now,
        }
    }
}

/// The bare round trip, on the worker's held connection: the floor of
/// nothing, shown to split the costs.
pub(crate) fn select1_op(conns: Arc<Vec<Held>>) -> Op {
    Arc::new(move |worker, _id| {
        let held = Arc::clone(&conns[worker]);
        Box::pin(async move {
            let client = held.lock_owned().await;
            if let Err(e) = client.simple_query("SELECT 1").await {
                panic!("SELECT 1: {e}");
            }
        })
    })
}

/// Which floor a [`floor_op`] runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Floor {
    Upsert,
    Read,
}

/// The floor's statement alone, prepared, in autocommit, on the worker's
/// held connection, with the values the limiter sends.
pub(crate) fn floor_op(
    conns: Arc<Vec<Held>>,
    prepared: Arc<Vec<Prepared>>,
    floor: Floor,
    window_secs: i64,
) -> Op {
    Arc::new(move |worker, id| {
        let held = Arc::clone(&conns[worker]);
        let (statement, vars) = match floor {
            Floor::Upsert => prepared[worker].upsert.clone(),
            Floor::Read => prepared[worker].read.clone(),
        };
        Box::pin(async move {
            let client = held.lock_owned().await;
            let values = Values::new(&id, window_secs);
            let params: Vec<&(dyn ToSql + Sync)> = vars.iter().map(|&v| values.get(v)).collect();
            if let Err(e) = client.query_one(&statement, &params).await {
                panic!("the floor {floor:?}: {e}");
            }
        })
    })
}
