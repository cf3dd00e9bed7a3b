//! What is measured, and how: calls back to back on concurrent tasks, their
//! latencies and throughput, the CPU time the server's processes spent
//! meanwhile, the statistics over rounds, the table's heap-only updates, and
//! the machine.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_postgres::Client;

use crate::Mode;
use crate::operations::{Held, Keys, Op};

/// xorshift64: plenty for picking keys.
pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// Every worker of every measurement draws its own sequence of keys.
pub(crate) fn next_seed() -> u64 {
    static SEED: AtomicU64 = AtomicU64::new(0x2545_f491_4f6c_dd1d);
    SEED.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
}

/// The figures of one measurement.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Sample {
    pub(crate) ops_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    /// Every call made, the warm-up's included.
    pub(crate) calls: u64,
    /// The time those calls took: from the start of the warm-up until the
    /// last call ended.
    pub(crate) wall_secs: f64,
    /// The CPU time the server's processes spent over `wall_secs`, when the
    /// server runs on this machine (see [`ServerCpu`]).
    pub(crate) server_cpu_secs: Option<f64>,
}

impl Sample {
    /// The calls per second of the server's CPU time: what one core of the
    /// server sustains. NaN when the server's CPU time is unknown or under
    /// a clock tick.
    pub(crate) fn calls_per_server_core_sec(&self) -> f64 {
        match self.server_cpu_secs {
            Some(cpu) if cpu > 0.0 => self.calls as f64 / cpu,
            _ => f64::NAN,
        }
    }

    /// How many cores the server kept busy, on average.
    pub(crate) fn server_cores_busy(&self) -> f64 {
        match self.server_cpu_secs {
            Some(cpu) if self.wall_secs > 0.0 => cpu / self.wall_secs,
            _ => f64::NAN,
        }
    }
}

/// Runs `op` on `workers` concurrent tasks, each calling it back to back:
/// first for the warm-up, whose calls are not recorded, then for the
/// measurement. Each call's latency is recorded; the throughput is the calls
/// started in the measurement over the time until the last of them ended.
/// The server's CPU time is read before the warm-up and after the last call.
pub(crate) async fn measure(op: &Op, workers: usize, keys: Keys, mode: Mode) -> Sample {
    let cpu_before = ServerCpu::secs();
    let began = Instant::now();
    let start = began + mode.warmup;
    let end = start + mode.measure;
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let op = Arc::clone(op);
            let mut rng = XorShift::new(next_seed());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut last = start;
                let mut calls = 0;
                loop {
                    let id = keys.draw(&mut rng);
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    op(worker, id).await;
                    let done = Instant::now();
                    calls += 1;
                    if began >= start {
                        latencies.push(done - began);
                        last = done;
                    }
                    // A call answered in memory never waits: let the other
                    // tasks run now and then.
                    tokio::task::coop::consume_budget().await;
                }
                (latencies, last, calls)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut last = start;
    let mut calls = 0;
    for task in tasks {
        match task.await {
            Ok((mine, my_last, my_calls)) => {
                latencies.extend(mine);
                last = last.max(my_last);
                calls += my_calls;
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let wall = began.elapsed();
    let cpu_after = ServerCpu::secs();
    let mut sample = sample(latencies, last - start, calls);
    sample.wall_secs = wall.as_secs_f64();
    sample.server_cpu_secs = cpu_before
        .zip(cpu_after)
        .map(|(before, after)| after - before);
    sample
}

/// The figures of the latencies recorded over `took`, the time from the
/// start of the measurement until its last call ended. The wall time is
/// `took`, and the server's CPU time unknown, unless the caller knows
/// better.
pub(crate) fn sample(mut latencies: Vec<Duration>, took: Duration, calls: u64) -> Sample {
    latencies.sort_unstable();
    let secs = took.as_secs_f64();
    Sample {
        ops_per_sec: if secs > 0.0 {
            latencies.len() as f64 / secs
        } else {
            0.0
        },
        p50_us: percentile_us(&latencies, 0.50),
        p99_us: percentile_us(&latencies, 0.99),
        calls,
        wall_secs: secs,
        server_cpu_secs: None,
    }
}

/// The nearest-rank percentile of sorted latencies, in microseconds.
fn percentile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1e6
}

/// The median, ignoring values that are not finite; NaN when none is.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    Summary::of(values).median
}

/// A figure over rounds: its median and range, and each round's value.
/// Values that are not finite are left out; all NaN when none is.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Summary {
    pub(crate) median: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
    pub(crate) each: Vec<f64>,
}

impl Summary {
    pub(crate) fn of(values: impl IntoIterator<Item = f64>) -> Summary {
        let each: Vec<f64> = values.into_iter().collect();
        let mut finite: Vec<f64> = each.iter().copied().filter(|v| v.is_finite()).collect();
        if finite.is_empty() {
            return Summary {
                median: f64::NAN,
                low: f64::NAN,
                high: f64::NAN,
                each,
            };
        }
        finite.sort_by(f64::total_cmp);
        let mid = finite.len() / 2;
        let median = if finite.len() % 2 == 1 {
            finite[mid]
        } else {
            (finite[mid - 1] + finite[mid]) / 2.0
        };
        Summary {
            median,
            low: finite[0],
            high: finite[finite.len() - 1],
            each,
        }
    }

    /// How many of the values are finite.
    pub(crate) fn count(&self) -> usize {
        self.each.iter().filter(|v| v.is_finite()).count()
    }
}

/// The CPU time of a PostgreSQL server running on this machine: the
/// postmaster's own and its reaped children's (`utime`, `stime`, `cutime`,
/// `cstime` of `/proc/<pid>/stat`), plus that of each live child (its
/// backends and background processes), in seconds.
///
/// The postmaster is found as the parent of the admin connection's
/// backend. Installed once; a server elsewhere (a `DATABASE_URL` host that
/// is not this machine) has none, and its CPU time is unknown.
pub(crate) struct ServerCpu {
    postmaster: u32,
    ticks_per_sec: f64,
}

static SERVER_CPU: OnceLock<Option<ServerCpu>> = OnceLock::new();

/// What `/proc/<pid>/stat` says of one process.
struct Stat {
    comm: String,
    ppid: u32,
    /// utime + stime, in clock ticks.
    own: u64,
    /// cutime + cstime: the reaped children's, in clock ticks.
    children: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold anything: the fields
    // after it follow its last closing parenthesis.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some(Stat {
        comm,
        ppid: u32::try_from(field(1)?).ok()?,
        own: field(11)? + field(12)?,
        children: field(13)? + field(14)?,
    })
}

impl ServerCpu {
    /// Finds the server of `admin`'s connection on this machine, if it is
    /// here, for [`ServerCpu::secs`].
    pub(crate) async fn install(admin: &Client) {
        let found = ServerCpu::find(admin).await;
        match &found {
            Some(cpu) => eprintln!(
                "server CPU time: postmaster {} and its children, from /proc",
                cpu.postmaster
            ),
            None => eprintln!("server CPU time: unknown (the server is not on this machine)"),
        }
        let _ = SERVER_CPU.set(found);
    }

    async fn find(admin: &Client) -> Option<ServerCpu> {
        let row = admin
            .query_one(
                "SELECT pg_catalog.pg_backend_pid(), pg_catalog.host(pg_catalog.inet_server_addr())",
                &[],
            )
            .await
            .ok()?;
        let backend: i32 = row.get(0);
        let address: Option<String> = row.get(1);
        // A Unix socket (no address) or loopback: the server is here.
        let here = address
            .as_deref()
            .is_none_or(|a| a.starts_with("127.") || a == "::1");
        if !here {
            return None;
        }
        let backend = stat(u32::try_from(backend).ok()?)?;
        let postmaster = backend.ppid;
        if backend.comm != "postgres" || stat(postmaster)?.comm != "postgres" {
            return None;
        }
        let ticks_per_sec = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|&t| t > 0.0)
            .unwrap_or(100.0);
        Some(ServerCpu {
            postmaster,
            ticks_per_sec,
        })
    }

    /// The server's CPU time so far, in seconds; `None` if unknown.
    pub(crate) fn secs() -> Option<f64> {
        let cpu = SERVER_CPU.get()?.as_ref()?;
        let postmaster = stat(cpu.postmaster)?;
        let mut ticks = postmaster.own + postmaster.children;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some(child) = stat(pid).filter(|s| s.ppid == cpu.postmaster) {
                ticks += child.own;
            }
        }
        Some(ticks as f64 / cpu.ticks_per_sec)
    }
}

/// How long PostgreSQL 15 and newer keep a backend's table counters before
/// flushing them to the shared statistics (at most once a second), plus a
/// margin.
const STATS_FLUSH_WAIT: Duration = Duration::from_millis(1100);

/// Updates of the table, and how many of them were heap-only (HOT).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct Updates {
    #[serde(rename = "n_tup_upd")]
    pub(crate) all: i64,
    #[serde(rename = "n_tup_hot_upd")]
    hot: i64,
}

impl Updates {
    pub(crate) fn since(self, before: Updates) -> Updates {
        Updates {
            all: self.all - before.all,
            hot: self.hot - before.hot,
        }
    }

    pub(crate) fn add(&mut self, other: Updates) {
        self.all += other.all;
        self.hot += other.hot;
    }

    pub(crate) fn ratio(self) -> f64 {
        if self.all > 0 {
            self.hot as f64 / self.all as f64
        } else {
            f64::NAN
        }
    }
}

/// The table's update counters, fresh: each backend flushes its counters at
/// the end of a transaction at most once a second, so wait that long, then
/// have every held connection end a transaction.
pub(crate) async fn updates(conns: &[Held], reader: &Client) -> Updates {
    tokio::time::sleep(STATS_FLUSH_WAIT).await;
    for held in conns {
        let client = held.lock().await;
        if let Err(e) = client.simple_query("SELECT 1").await {
            panic!("flushing the statistics: {e}");
        }
    }
    let row = reader
        .query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_catalog.pg_stat_user_tables \
             WHERE relid = 'platformkit.platformkit_limits'::regclass",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("reading pg_stat_user_tables: {e}"));
    Updates {
        all: row.get(0),
        hot: row.get(1),
    }
}

/// The machine and the server the figures come from.
#[derive(Serialize)]
pub(crate) struct Machine {
    nproc: usize,
    cpu: String,
    postgres: String,
    fsync: String,
    synchronous_commit: String,
    server: &'static str,
}

impl Machine {
    pub(crate) async fn read(admin: &Client, owned: bool) -> Machine {
        let show = async |setting: &str| -> String {
            admin
                .query_one(&format!("SHOW {setting}"), &[])
                .await
                .unwrap_or_else(|e| panic!("SHOW {setting}: {e}"))
                .get(0)
        };
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            cpu,
            postgres: show("server_version").await,
            fsync: show("fsync").await,
            synchronous_commit: show("synchronous_commit").await,
            server: if owned { "throwaway" } else { "DATABASE_URL" },
        }
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "machine: {} CPUs, {}; PostgreSQL {} ({} server, fsync {}, synchronous_commit {})",
            self.nproc, self.cpu, self.postgres, self.server, self.fsync, self.synchronous_commit
        )
    }
}
