//! What preparing a statement once per connection saves the server: the
//! limiter's read (`SELECT platformkit.platformkit_limit_read(…)`)
//! and write (`CALL platformkit.platformkit_limit_add(…)`), each sent as
//! the default sends it (one unnamed Parse, Bind, Execute and Sync) and as
//! `Prepared` sends it (Bind, Execute and Sync of a statement prepared on
//! the connection), with the same parameters. `docs/PERFORMANCE.md` has the
//! figures and how they were taken.
//!
//! ```text
//! cargo bench --bench prepare -- wall 10 3000   # interleaved A/B: 10 rounds of 3,000 calls each
//! DATABASE_URL=… cargo bench --bench prepare -- callgrind
//! ```
//!
//! `wall`: one connection per way, the two ways taking turns in each round
//! (the order swapped every round); the median per call over rounds and the
//! backend's CPU time per call (from `/proc`, when the server is local).
//! `RELAXED=1` sends the write with relaxed durability, so the WAL flush's
//! wait does not drown the difference.
//!
//! `callgrind`: for a server started under `valgrind --tool=callgrind`
//! (each backend, forked, writes its own profile, named by its pid): for
//! each statement and each way, a connection that makes 100 calls and one
//! that makes 1,100, their backend pids printed. The difference of the two
//! backends' instruction counts over 1,000 is the cost of one call, the
//! connection's start and end cancelled out.

use std::time::{Duration, Instant};

use platformkit_limit::SCHEMA;
use platformkit_limit_testdb::{Options, Server};
use postgres_types::{ToSql, Type};
use tokio_postgres::{Client, NoTls};

const READ: &str = "SELECT platformkit.platformkit_limit_read(\
    p_key => $1, p_window_secs => $2, p_at => $3, p_budget_ms => $4, \
    p_previous => $5, p_max => $6, p_lockout_secs => $7)";
const ADD: &str = "CALL platformkit.platformkit_limit_add(\
    p_key => $1, p_add => $2, p_window_secs => $3, p_at => $4, p_budget_ms => $5, \
    p_relaxed => $6, p_previous => $7, p_max => $8, p_lockout_secs => $9)";

const READ_TYPES: [Type; 7] = [
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::BOOL,
    Type::INT8,
    Type::INT8,
];
const ADD_TYPES: [Type; 9] = [
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::BOOL,
    Type::BOOL,
    Type::INT8,
    Type::INT8,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Read,
    Write,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Unnamed,
    Prepared,
}

struct Conn {
    client: Client,
    task: tokio::task::JoinHandle<()>,
    pid: i32,
    read: tokio_postgres::Statement,
    add: tokio_postgres::Statement,
}

async fn open(config: &tokio_postgres::Config) -> Conn {
    let (client, connection) = config.connect(NoTls).await.unwrap();
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let read = client.prepare_typed(READ, &READ_TYPES).await.unwrap();
    let add = client.prepare_typed(ADD, &ADD_TYPES).await.unwrap();
    Conn {
        client,
        task,
        pid,
        read,
        add,
    }
}

impl Conn {
    async fn one(&self, op: Op, mode: Mode, i: u64) {
        let key = format!("bench|key-{}", i % 64);
        let key = key.as_str();
        let at: Option<i64> = None;
        let (window, budget, max, lockout, add, f) =
            (60i64, 1000i64, 1_000_000_000i64, 0i64, 1i64, false);
        match op {
            Op::Read => {
                let p: [&(dyn ToSql + Sync); 7] = [&key, &window, &at, &budget, &f, &max, &lockout];
                match mode {
                    Mode::Unnamed => {
                        let typed: Vec<_> = p.iter().copied().zip(READ_TYPES).collect();
                        self.client.query_typed_one(READ, &typed).await.unwrap();
                    }
                    Mode::Prepared => {
                        self.client.query_one(&self.read, &p).await.unwrap();
                    }
                }
            }
            Op::Write => {
                let relaxed = std::env::var_os("RELAXED").is_some();
                let p: [&(dyn ToSql + Sync); 9] = [
                    &key, &add, &window, &at, &budget, &relaxed, &f, &max, &lockout,
                ];
                match mode {
                    Mode::Unnamed => {
                        let typed: Vec<_> = p.iter().copied().zip(ADD_TYPES).collect();
                        self.client.query_typed_one(ADD, &typed).await.unwrap();
                    }
                    Mode::Prepared => {
                        self.client.query_one(&self.add, &p).await.unwrap();
                    }
                }
            }
        }
    }

    async fn close(self) {
        drop(self.client);
        let _ = self.task.await;
    }
}

/// utime + stime of a local backend, in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    Some(f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // (`cargo bench` passes `--bench`.)
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if !matches!(args.first().map(String::as_str), Some("callgrind" | "wall")) {
        eprintln!("usage: cargo bench --bench prepare -- callgrind | wall ROUNDS CALLS");
        return;
    }
    let server = Server::from_env_or_start(Options { durable: true });
    let db = server.database(SCHEMA).await;
    let config = db.tenant_config();
    match args.first().map(String::as_str) {
        Some("callgrind") => {
            let n: [u64; 2] = [100, 1100];
            for op in [Op::Read, Op::Write] {
                for mode in [Mode::Unnamed, Mode::Prepared] {
                    for &calls in &n {
                        let conn = open(&config).await;
                        for i in 0..calls {
                            conn.one(op, mode, i).await;
                        }
                        println!(
                            "phase op={op:?} mode={mode:?} calls={calls} pid={}",
                            conn.pid
                        );
                        conn.close().await;
                    }
                }
            }
            // Let the backends exit and write their profiles.
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        Some("wall") => {
            let rounds: usize = args.get(1).map_or(10, |a| a.parse().unwrap());
            let calls: u64 = args.get(2).map_or(5000, |a| a.parse().unwrap());
            let unnamed = open(&config).await;
            let prepared = open(&config).await;
            for op in [Op::Read, Op::Write] {
                let mut per = [Vec::new(), Vec::new()];
                let mut ticks = [0u64; 2];
                for round in 0..rounds {
                    let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                    for which in order {
                        let (conn, mode) = if which == 0 {
                            (&unnamed, Mode::Unnamed)
                        } else {
                            (&prepared, Mode::Prepared)
                        };
                        let t0 = cpu_ticks(conn.pid);
                        let start = Instant::now();
                        for i in 0..calls {
                            conn.one(op, mode, i).await;
                        }
                        let us = start.elapsed().as_secs_f64() * 1e6 / calls as f64;
                        if let (Some(a), Some(b)) = (t0, cpu_ticks(conn.pid)) {
                            ticks[which] += b - a;
                        }
                        per[which].push(us);
                    }
                }
                let median = |v: &mut Vec<f64>| {
                    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                    v[v.len() / 2]
                };
                let (u, p) = (median(&mut per[0]), median(&mut per[1]));
                let total = (rounds as u64 * calls) as f64;
                let tick_us = 1e6 / 100.0;
                println!(
                    "{op:?}: wall median µs/call unnamed {u:.1} prepared {p:.1} ratio {:.3}; \
                     backend CPU µs/call unnamed {:.1} prepared {:.1}",
                    p / u,
                    ticks[0] as f64 * tick_us / total,
                    ticks[1] as f64 * tick_us / total,
                );
            }
            unnamed.close().await;
            prepared.close().await;
        }
        _ => unreachable!("the mode is checked above"),
    }
}
