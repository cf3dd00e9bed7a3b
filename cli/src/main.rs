//! `platformkit-limit`: the operator's tool. Applies the schema and the
//! grants, reads a key's state, unlocks a key, lists who a limit refuses,
//! and purges closed windows, on the database `DATABASE_URL` names.
//! The crate platformkit-limit-cli, over the library's public API.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use platformkit_limit::{Key, KeyStatus, Limiter, Postgres, Strategy};

const USAGE: &str = "\
usage: platformkit-limit <command> [arguments]

The database is DATABASE_URL (postgres://user:password@host:port/dbname or
key=value pairs), as a role with the limiter's grants (migrate: the role that
owns the schema).

commands:
  migrate [--grant ROLE]...     apply the schema, then the grants for each ROLE
  limits                        the limits the services have used, as defined
  status KEY                    the key under every limit that has a count for it
  status LIMIT KEY              the key under LIMIT: count, window end,
                                reopening, lockout
  reset LIMIT KEY WHO           unlock: clear the key's windows under LIMIT
  reset --every-limit KEY WHO   unlock: clear the key under every limit
  block LIMIT KEY --for D WHO   refuse the key under LIMIT for D (30s, 15m,
                                1h, 1d; at most 30d), whatever its count
  unblock LIMIT KEY WHO         end the key's block, its counts kept
  locked LIMIT [--at-most N]    the keys LIMIT refuses now, newest first
                                (N: 1 to 1000, 100 unless given)
  audit [LIMIT] [--at-most N]   who reset, blocked or unblocked what, when
                                and why, newest first
  purge                         delete closed windows, in batches, until done
  help                          this text

WHO is --reason TEXT [--by NAME]: why, and who (the login's USER unless
given), written with the action in the audit.

LIMIT is a limit's name, as `limits` lists it: each limit is recorded, with
its max, window and lockout, by the service at start-up (Limiter::record).

KEY is an email address or an IP address, a key as this tool shows it
(email|alice@example.com, account|42), or kind:value, the kind email, user,
ip or id; an address or a kind:value is normalized as the service does:
  alice@example.com   203.0.113.7   user:bob   email:alice@example.com   id:abc123
A key as shown holds | and may hold \\: quote it for the shell,
  platformkit-limit reset login 'account|42|203.0.113.7'

exit status: 0 done, 1 error (nothing to reset included), 2 usage";

/// What went wrong: the usage (exit 2) or the work (exit 1).
enum Failure {
    Usage(String),
    Failed(String),
}

impl From<platformkit_limit::Error> for Failure {
    fn from(e: platformkit_limit::Error) -> Self {
        Failure::Failed(error_chain(&e))
    }
}

/// The error's message and its causes', one after another.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("platformkit-limit: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("platformkit-limit: {message}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(message)) => {
            eprintln!("platformkit-limit: {message}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: &[String]) -> Result<(), Failure> {
    let Some((command, rest)) = args.split_first() else {
        return Err(Failure::Usage("a command is needed".into()));
    };
    match command.as_str() {
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        "migrate" => migrate(rest).await,
        "limits" => {
            no_more(rest)?;
            limits().await
        }
        "status" => status(rest).await,
        "reset" => reset(rest).await,
        "block" | "unblock" => block(command == "block", rest).await,
        "audit" => audit(rest).await,
        "locked" => locked(rest).await,
        "purge" => {
            no_more(rest)?;
            let deleted = platformkit_limit::purge(&config()?).await?;
            println!("purged {deleted} rows");
            Ok(())
        }
        other => Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
}

/// The connection settings `DATABASE_URL` gives.
fn config() -> Result<tokio_postgres::Config, Failure> {
    let url = std::env::var("DATABASE_URL").map_err(|_| {
        Failure::Failed("DATABASE_URL is not set: it names the database to operate on".into())
    })?;
    url.parse()
        .map_err(|e| Failure::Failed(format!("DATABASE_URL: {}", error_chain(&e))))
}

/// A limiter over `DATABASE_URL`, with no refusal cache: every answer is
/// the database's.
fn limiter() -> Result<Limiter<Postgres<tokio_postgres::Config>>, Failure> {
    Ok(Limiter::builder(Postgres::new(config()?))
        .no_refusal_cache()
        .build()?)
}

async fn migrate(args: &[String]) -> Result<(), Failure> {
    let mut roles = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--grant" => {
                let role = value(&mut args, "--grant")?;
                // Refused before anything is applied: `public` is every login.
                let grants = platformkit_limit::grants(&role)
                    .map_err(|e| Failure::Usage(format!("migrate --grant: {e}")))?;
                roles.push((role, grants));
            }
            other => return Err(Failure::Usage(format!("migrate: unexpected {other:?}"))),
        }
    }
    let config = config()?;
    Postgres::new(config.clone()).migrate().await?;
    println!("schema applied");
    if roles.is_empty() {
        return Ok(());
    }
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| Failure::Failed(format!("connecting: {}", error_chain(&e))))?;
    let driver = tokio::spawn(connection);
    let sql_failed = |what: &str, e: tokio_postgres::Error| {
        Failure::Failed(format!("{what}: {}", error_chain(&e)))
    };
    for (role, grants) in &roles {
        client
            .batch_execute(grants)
            .await
            .map_err(|e| sql_failed(&format!("granting {role:?}"), e))?;
        println!("granted {role}");
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}

async fn limits() -> Result<(), Failure> {
    let limits = limiter()?.limits().await?;
    if limits.is_empty() {
        println!("{NONE_RECORDED}");
    }
    for limit in &limits {
        let lockout = limit
            .lockout()
            .map_or_else(String::new, |d| format!(", lockout {}", span(d.as_secs())));
        let sliding = if limit.strategy() == Strategy::Sliding {
            ", sliding"
        } else {
            ""
        };
        println!(
            "{}: max {} per {}{sliding}{lockout}",
            limit.name(),
            limit.max(),
            span(limit.window().as_secs())
        );
    }
    Ok(())
}

/// What `limits` says when no limit is recorded.
const NONE_RECORDED: &str =
    "no limit is recorded yet: a service records its limits at start-up (Limiter::record)";

async fn status(args: &[String]) -> Result<(), Failure> {
    let limiter = limiter()?;
    let statuses = match args {
        [key] => {
            let key: Key = key.parse()?;
            let statuses = limiter.statuses(&key).await?;
            if statuses.is_empty() {
                println!("no limit has a count for {}", key.spelling());
            }
            statuses
        }
        [name, key] => {
            let key: Key = key.parse()?;
            vec![limiter.status(&limiter.limit(name).await?, &key).await?]
        }
        _ => return Err(Failure::Usage("status: KEY, or LIMIT and KEY".into())),
    };
    for (i, status) in statuses.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print_status(status);
    }
    Ok(())
}

async fn reset(args: &[String]) -> Result<(), Failure> {
    let (words, options) = options(args, &["--reason", "--by"], &["--every-limit"])?;
    let (name, key) = match (&words[..], options.contains_key("--every-limit")) {
        ([key], true) => (None, key),
        ([name, key], false) => (Some(name), key),
        _ => {
            return Err(Failure::Usage(
                "reset: LIMIT and KEY, or --every-limit and KEY".into(),
            ));
        }
    };
    let key: Key = key.parse()?;
    let (by, reason) = who(&options)?;
    let limiter = limiter()?;
    let cleared: Vec<(String, u64)> = match name {
        Some(name) => {
            let limit = limiter.limit(name).await?;
            let windows = limiter.unlock(&limit, &key, &by, reason).await?;
            vec![(name.to_string(), windows)]
        }
        None => limiter
            .unlock_everywhere(&key, &by, reason)
            .await?
            .into_iter()
            .map(|(limit, windows)| (limit.name().to_owned(), windows))
            .collect(),
    };
    let cleared: Vec<_> = cleared.into_iter().filter(|(_, n)| *n > 0).collect();
    if cleared.is_empty() {
        // Another kind or spelling of the key: nothing was unlocked, and
        // the operator must know.
        return Err(Failure::Failed(format!(
            "nothing to reset: no window of {} is stored under {} (check the key)",
            key.spelling(),
            name.map_or("any limit", |n| n.as_str())
        )));
    }
    for (name, windows) in cleared {
        println!("reset {name} {}: {windows} windows", key.spelling());
    }
    Ok(())
}

async fn block(blocking: bool, args: &[String]) -> Result<(), Failure> {
    let allowed: &[&str] = if blocking {
        &["--reason", "--by", "--for"]
    } else {
        &["--reason", "--by"]
    };
    let (words, options) = options(args, allowed, &[])?;
    let [name, key] = &words[..] else {
        return Err(Failure::Usage("block, unblock: LIMIT and KEY".into()));
    };
    let key: Key = key.parse()?;
    let (by, reason) = who(&options)?;
    let limiter = limiter()?;
    let limit = limiter.limit(name).await?;
    if !blocking {
        let ended = limiter.unblock(&limit, &key, &by, reason).await?;
        if ended == 0 {
            return Err(Failure::Failed(format!(
                "nothing to unblock: {name} {} has no block",
                key.spelling()
            )));
        }
        println!("unblocked {name} {}", key.spelling());
        return Ok(());
    }
    let length = options
        .get("--for")
        .ok_or_else(|| Failure::Usage("block: --for D is needed".into()))?;
    let until = limiter
        .block(&limit, &key, duration(length)?, &by, reason)
        .await?;
    println!("blocked {name} {} until {}", key.spelling(), utc(until));
    Ok(())
}

async fn audit(args: &[String]) -> Result<(), Failure> {
    let (words, options) = options(args, &["--at-most"], &[])?;
    let at_most = options
        .get("--at-most")
        .map_or(Ok(100), |n| number(n, "--at-most"))?;
    let limiter = limiter()?;
    let limit = match &words[..] {
        [] => None,
        [name] => Some(limiter.limit(name).await?),
        _ => return Err(Failure::Usage("audit: at most one LIMIT".into())),
    };
    let entries = limiter.audit(limit.as_ref(), at_most).await?;
    if entries.is_empty() {
        println!("the audit is empty");
    }
    for entry in &entries {
        let key = Key::from_encoded(entry.key())
            .map_or_else(|| format!("{:?}", entry.key()), |key| key.spelling());
        let until = entry
            .until()
            .map_or_else(String::new, |at| format!(" until {}", utc(at)));
        let windows = entry
            .windows()
            .map_or_else(String::new, |n| format!(" ({n} windows)"));
        // Who and why as typed, but a control character escaped: no line of
        // the audit can forge another, or write to the terminal.
        println!(
            "{} {} {} {} {key}{until}{windows}: {}",
            utc(entry.at()),
            entry.by().escape_debug(),
            entry.action().as_str(),
            entry.limit(),
            entry.reason().escape_debug()
        );
    }
    Ok(())
}

/// Who did an operator's call and why: `--by` (or the login's `USER`) and
/// `--reason`.
fn who<'a>(options: &'a HashMap<&str, String>) -> Result<(String, &'a str), Failure> {
    let reason = options
        .get("--reason")
        .filter(|reason| !reason.trim().is_empty())
        .ok_or_else(|| Failure::Usage("--reason TEXT is needed: the audit keeps why".into()))?;
    let by = match options.get("--by") {
        Some(by) if by.trim().is_empty() => {
            return Err(Failure::Usage("--by NAME: a name is needed".into()));
        }
        Some(by) => by.clone(),
        None => std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .map_err(|_| Failure::Usage("--by NAME is needed: no USER to take it from".into()))?,
    };
    Ok((by, reason))
}

/// The words and the options of `args`: each of `valued` takes the next
/// argument, each of `flags` none; anything else starting with `--` is a
/// usage error.
fn options<'a>(
    args: &'a [String],
    valued: &[&'static str],
    flags: &[&'static str],
) -> Result<(Vec<&'a String>, HashMap<&'static str, String>), Failure> {
    let mut words = Vec::new();
    let mut options = HashMap::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let given = if let Some(&option) = valued.iter().find(|&&o| o == arg) {
            options.insert(option, value(&mut args, option)?)
        } else if let Some(&flag) = flags.iter().find(|&&f| f == arg) {
            options.insert(flag, String::new())
        } else if arg.starts_with("--") {
            return Err(Failure::Usage(format!("unexpected {arg:?}")));
        } else {
            words.push(arg);
            None
        };
        if given.is_some() {
            return Err(Failure::Usage(format!("{arg} is given twice")));
        }
    }
    Ok((words, options))
}

async fn locked(args: &[String]) -> Result<(), Failure> {
    let (words, options) = options(args, &["--at-most"], &[])?;
    let [name] = &words[..] else {
        return Err(Failure::Usage("locked: LIMIT [--at-most N]".into()));
    };
    let at_most = options
        .get("--at-most")
        .map_or(Ok(100), |n| number(n, "--at-most"))?;
    let limiter = limiter()?;
    let refused = limiter
        .refused_keys(&limiter.limit(name).await?, at_most)
        .await?;
    if refused.is_empty() {
        println!("no key of {name} is refused");
    }
    for status in &refused {
        let reopens = status.reopens_at().map_or_else(String::new, |at| {
            format!(" reopens {}", when(at, status.read_at()))
        });
        let locked = status
            .locked_until()
            .map_or_else(String::new, |at| format!(" locked until {}", utc(at)));
        println!(
            "{} count {} of {}{reopens}{locked}",
            shown(status),
            status.count(),
            status.max()
        );
    }
    Ok(())
}

fn print_status(status: &KeyStatus) {
    println!("limit: {}", status.limit());
    println!("key: {}", shown(status));
    println!("count: {} of {}", status.count(), status.max());
    println!(
        "refused: {}",
        if status.is_refused() { "yes" } else { "no" }
    );
    println!(
        "window ends: {}",
        when(status.window_end(), status.read_at())
    );
    if let Some(at) = status.reopens_at() {
        println!("reopens: {}", when(at, status.read_at()));
    }
    if let Some(at) = status.locked_until() {
        println!("locked until: {}", when(at, status.read_at()));
    }
}

/// A status's key as the tool shows it: its spelling, which the tool reads
/// back as that key; a stored text no key encodes to (a row written by
/// hand) quoted, with Rust's escapes.
fn shown(status: &KeyStatus) -> String {
    Key::from_encoded(status.key())
        .map_or_else(|| format!("{:?}", status.key()), |key| key.spelling())
}

fn value<'a>(args: &mut impl Iterator<Item = &'a String>, option: &str) -> Result<String, Failure> {
    args.next()
        .cloned()
        .ok_or_else(|| Failure::Usage(format!("{option} needs a value")))
}

fn number(text: &str, option: &str) -> Result<usize, Failure> {
    text.parse()
        .map_err(|_| Failure::Usage(format!("{option}: {text:?} is not a whole number")))
}

/// `30s`, `15m`, `1h`, `1d`, or a number of seconds.
fn duration(text: &str) -> Result<Duration, Failure> {
    let bad = || Failure::Usage(format!("{text:?} is not a duration (30s, 15m, 1h, 1d)"));
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(scale)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

fn no_more(args: &[String]) -> Result<(), Failure> {
    match args.first() {
        None => Ok(()),
        Some(arg) => Err(Failure::Usage(format!("unexpected {arg:?}"))),
    }
}

/// `at` in UTC, and how far from `now`.
fn when(at: SystemTime, now: SystemTime) -> String {
    let secs = at.duration_since(now).map_or(0, |d| d.as_secs());
    format!("{} (in {})", utc(at), span(secs))
}

fn span(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` (the civil calendar from days since the epoch).
fn utc(at: SystemTime) -> String {
    let secs = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    };
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
