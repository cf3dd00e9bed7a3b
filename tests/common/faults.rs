//! Faults a test causes on the server while the limiter works: every write
//! slow, or the backend of a call killed while the call waits on a row lock.

use std::future::Future;
use std::time::Duration;

use platformkit_limit_testdb::TestDb;
use tokio::time::Instant;
use tokio_postgres::Client;

use super::db::{terminate_backend, until_a_call_waits_on_a_lock};
use super::{SLACK, timed};

/// Makes every write of the table take 0.8 s, for reasons no `lock_timeout`
/// covers (a trigger that sleeps), until [`end_slow_writes`].
pub async fn slow_writes(db: &TestDb) {
    db.connect()
        .await
        .batch_execute(
            "CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_sleep(0.8);
                 RETURN NEW;
             END
             $$;
             CREATE TRIGGER slow_write BEFORE INSERT OR UPDATE ON platformkit.platformkit_limits
                 FOR EACH ROW EXECUTE FUNCTION slow_write();",
        )
        .await
        .expect("making writes slow");
}

/// Ends [`slow_writes`].
pub async fn end_slow_writes(db: &TestDb) {
    db.connect()
        .await
        .batch_execute("DROP TRIGGER slow_write ON platformkit.platformkit_limits")
        .await
        .expect("dropping the slow trigger");
}

/// Runs `call` (a limiter's call on the backend `pid`) and, as soon as a
/// call waits on a row lock, kills that backend as the superuser `admin`.
/// Returns what the call gave, after asserting that it ended within
/// `budget` (the call's own, long, so that only the kill ends it early) and
/// at most [`SLACK`] after the kill.
pub async fn kill_while_it_waits_on_a_lock<T>(
    admin: &Client,
    pid: i32,
    budget: Duration,
    what: &str,
    call: impl Future<Output = T>,
) -> T {
    let kill = async {
        let waiting = until_a_call_waits_on_a_lock(admin, budget).await;
        assert_eq!(waiting, pid, "{what}: another backend waits on the lock");
        terminate_backend(admin, pid).await;
        Instant::now()
    };
    let call = async {
        let output = call.await;
        (output, Instant::now())
    };
    let (((output, ended), killed_at), took) =
        timed(budget + SLACK, what, async { tokio::join!(call, kill) }).await;
    assert!(took < budget, "{what}: the call took {took:?}");
    assert!(
        ended - killed_at < SLACK,
        "{what}: the call ended {:?} after its backend was killed",
        ended - killed_at
    );
    output
}
