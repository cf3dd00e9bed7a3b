//! Process plumbing for throwaway servers: the account PostgreSQL runs as, the scratch
//! directory, tying postmasters to the lifetime of this process, and cleaning up after
//! processes that died without doing so themselves.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// Name of the scratch directory under [`std::env::temp_dir`].
const BASE_NAME: &str = "platformkit-limit-pg";

/// The account that owns a throwaway cluster and runs its binaries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunAs {
    uid: u32,
    gid: u32,
}

impl RunAs {
    /// PostgreSQL refuses to run as root: when this process is root, pick the `postgres`
    /// system account, or `nobody` when there is none. `None` means "run as ourselves".
    pub(crate) fn get() -> Option<RunAs> {
        static RUN_AS: OnceLock<Option<RunAs>> = OnceLock::new();
        *RUN_AS.get_or_init(|| {
            // SAFETY: geteuid has no preconditions and cannot fail.
            if unsafe { libc::geteuid() } != 0 {
                return None;
            }
            let found = lookup_user("postgres").or_else(|| lookup_user("nobody"));
            Some(found.unwrap_or_else(|| {
                panic!(
                    "running as root, and PostgreSQL refuses to run as root, but neither a \
                     `postgres` nor a `nobody` account exists to run it as"
                )
            }))
        })
    }

    /// Makes `command` run as this account.
    pub(crate) fn apply(this: Option<RunAs>, command: &mut Command) {
        if let Some(run_as) = this {
            command.uid(run_as.uid).gid(run_as.gid);
        }
    }

    /// Gives `path` to this account.
    pub(crate) fn chown(this: Option<RunAs>, path: &Path) -> io::Result<()> {
        match this {
            Some(run_as) => std::os::unix::fs::chown(path, Some(run_as.uid), Some(run_as.gid)),
            None => Ok(()),
        }
    }

    /// Gives the symbolic link `path` itself to this account.
    pub(crate) fn lchown(this: Option<RunAs>, path: &Path) -> io::Result<()> {
        match this {
            Some(run_as) => std::os::unix::fs::lchown(path, Some(run_as.uid), Some(run_as.gid)),
            None => Ok(()),
        }
    }
}

fn lookup_user(name: &str) -> Option<RunAs> {
    let name = CString::new(name).ok()?;
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: `passwd` is a plain C struct for which all-zero bytes are a valid value.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the duration of the call, and `buffer.len()` is the
    // true size of `buffer`; the strings `entry` points into are not used afterwards.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some(RunAs {
        uid: entry.pw_uid,
        gid: entry.pw_gid,
    })
}

/// Removes the variables PostgreSQL programs would otherwise pick up from the caller's
/// environment (`PGDATA`, `PGPORT`, locale, ...), so every cluster behaves the same.
pub(crate) fn sanitize_env(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("PG") || key.starts_with("LC_") || key == "LANG" {
            command.env_remove(key);
        }
    }
    command.env("LC_ALL", "C");
}

/// `<temp>/platformkit-limit-pg`, created (mode 0755, so the unprivileged account can
/// traverse it) and cleaned of what dead processes left behind. Also starts the exit
/// watchdog. Runs its one-time work once per process.
pub(crate) fn base_dir() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        let base = std::env::temp_dir().join(BASE_NAME);
        fs::create_dir_all(&base).unwrap_or_else(|e| panic!("creating {}: {e}", base.display()));
        // Best effort: the directory may belong to another user, who then made it usable.
        let _ = fs::set_permissions(&base, fs::Permissions::from_mode(0o755));
        remove_stale(&base);
        start_exit_watchdog(&base);
        base
    })
}

/// Creates a fresh, empty directory `<base>/<pid>-<n>` (mode 0755) for one cluster (or
/// one PgBouncer).
pub(crate) fn new_cluster_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = base_dir();
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("{}-{n}", std::process::id()));
        match fs::create_dir(&dir) {
            Ok(()) => {
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
                    .unwrap_or_else(|e| panic!("chmod {}: {e}", dir.display()));
                return dir;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("creating {}: {e}", dir.display()),
        }
    }
}

/// Removes `<base>/<pid>-*` directories of processes that no longer exist (and of an
/// earlier process that had our pid), stopping any postmaster still running in them.
fn remove_stale(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    let own = std::process::id() as libc::pid_t;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if pid == own || !process_exists(pid) {
            let dir = entry.path();
            stop_postmaster(&dir.join("data"), None);
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

fn process_exists(pid: libc::pid_t) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission; nothing is delivered.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Shell script run as the exit watchdog: it blocks until its stdin reaches end-of-file,
/// which happens when this process exits, however it exits (even SIGKILL), since only
/// this process holds the write end. It then stops every postmaster whose data directory
/// is under `<base>/<pid>-*` (including ones restarted by `pg_ctl`, which are not our
/// children) and removes those directories. It ignores terminal signals and runs in its
/// own process group, so Ctrl-C on the test run does not kill it before it has cleaned up.
const WATCHDOG_SCRIPT: &str = r#"
trap '' INT TERM HUP QUIT PIPE
while read -r _; do :; done
is_postmaster() {
  tr '\000' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}
for d in "$1/$2"-*; do
  [ -d "$d" ] || continue
  pid=$(head -n 1 "$d/data/postmaster.pid" 2>/dev/null)
  case "$pid" in ''|*[!0-9]*) pid= ;; esac
  if [ -n "$pid" ] && is_postmaster "$pid" "$d/data"; then
    kill -QUIT "$pid" 2>/dev/null
    i=0
    while [ "$i" -lt 100 ] && is_postmaster "$pid" "$d/data"; do
      sleep 0.1
      i=$((i + 1))
    done
    if is_postmaster "$pid" "$d/data"; then kill -KILL "$pid" 2>/dev/null; sleep 0.5; fi
  fi
  rm -rf "$d"
done
"#;

fn start_exit_watchdog(base: &Path) {
    static WATCHDOG: OnceLock<Option<ChildStdin>> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let spawned = Command::new("/bin/sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("platformkit-limit-testdb-cleanup")
            .arg(base)
            .arg(std::process::id().to_string())
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        match spawned {
            // The `Child` is dropped without waiting: the watchdog must outlive us.
            Ok(mut child) => child.stdin.take(),
            Err(e) => {
                eprintln!(
                    "platformkit-limit-testdb: could not start the exit watchdog ({e}); \
                     directories under {} are removed by the next run instead",
                    base.display()
                );
                None
            }
        }
    });
}

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Spawns `command` so that it receives SIGQUIT (PostgreSQL's "immediate shutdown") when
/// this process dies, even if nothing gets to run a destructor.
pub(crate) fn spawn_tied_to_process(command: Command) -> io::Result<Child> {
    spawn_tied_to_process_with(command, libc::SIGQUIT)
}

/// Spawns `command` so that it receives `signal` when this process dies, even if nothing
/// gets to run a destructor.
///
/// The kernel delivers the parent-death signal when the *thread* that forked the child
/// exits, so all such children are spawned by one dedicated thread that lives as long as
/// the process does.
pub(crate) fn spawn_tied_to_process_with(
    mut command: Command,
    signal: libc::c_int,
) -> io::Result<Child> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();

    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the hook runs in the forked child before exec, after the uid/gid switch, and
    // only makes async-signal-safe system calls (prctl, getppid) without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then nobody would signal us.
            if libc::getppid() != parent {
                return Err(io::Error::other("parent exited before the child started"));
            }
            Ok(())
        });
    }

    let keeper = KEEPER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("postgres-keeper".into())
            .spawn(move || {
                // The sender lives in a static, so this loop (and the thread) never ends.
                for mut request in receiver {
                    let _ = request.reply.send(request.command.spawn());
                }
            })
            .expect("spawning the postgres keeper thread");
        Mutex::new(sender)
    });
    let (reply, response) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send(SpawnRequest { command, reply })
        .expect("the postgres keeper thread is gone");
    response
        .recv()
        .expect("the postgres keeper thread dropped a request")
}

/// The postmaster pid recorded in `<data>/postmaster.pid`, if any.
pub(crate) fn postmaster_pid(data_dir: &Path) -> Option<libc::pid_t> {
    let contents = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    contents
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
        .filter(|pid: &libc::pid_t| *pid > 0)
}

/// Whether `pid` is a live (not zombie) postmaster serving `data_dir`. Guards against
/// signalling an unrelated process that reused a stale pid.
fn is_postmaster_of(pid: libc::pid_t, data_dir: &Path) -> bool {
    // A zombie has an empty command line, so it does not match.
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let cmdline: Vec<u8> = cmdline
        .into_iter()
        .map(|b| if b == 0 { b' ' } else { b })
        .collect();
    let needle = data_dir.as_os_str().as_encoded_bytes();
    !needle.is_empty() && cmdline.windows(needle.len()).any(|w| w == needle)
}

/// Stops the postmaster serving `data_dir` with an immediate shutdown (SIGQUIT), falling
/// back to SIGKILL, and waits for it to be gone. `child` is the postmaster we spawned
/// ourselves, if any, which is reaped.
pub(crate) fn stop_postmaster(data_dir: &Path, child: Option<&mut Child>) {
    if let Some(pid) = postmaster_pid(data_dir).filter(|&pid| is_postmaster_of(pid, data_dir)) {
        // SAFETY: plain kill(2) of a process verified to be this cluster's postmaster.
        unsafe { libc::kill(pid, libc::SIGQUIT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_postmaster_of(pid, data_dir) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        if is_postmaster_of(pid, data_dir) {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while is_postmaster_of(pid, data_dir) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
    if let Some(child) = child {
        // Normally the postmaster was this child and has exited by now. If it is still
        // running (it had not written postmaster.pid yet), stop it the same way.
        if let Ok(None) = child.try_wait() {
            // SAFETY: plain kill(2) of our own, not yet reaped, child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGQUIT) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
