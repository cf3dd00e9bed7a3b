//! A throwaway PostgreSQL cluster owned by this process: initialised, configured, started,
//! controlled with `pg_ctl`, and stopped and deleted on drop.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::Options;
use crate::locate;
use crate::process::{self, RunAs};

/// File, inside the data directory, holding the settings this crate manages.
const SETTINGS_FILE: &str = "platformkit-limit.conf";
/// Name of the server log, in the cluster directory (beside the data directory).
const LOG_FILE: &str = "postgres.log";
/// How long a starting server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How many ports to try when the chosen one is taken before the server binds it.
const PORT_ATTEMPTS: usize = 8;

/// The bootstrap superuser created by `initdb -U`.
pub(crate) const SUPERUSER: &str = "postgres";

pub(crate) struct Cluster {
    bin_dir: &'static Path,
    run_as: Option<RunAs>,
    /// `<base>/<pid>-<n>`: holds `data/` and the log; removed on drop.
    dir: PathBuf,
    data_dir: PathBuf,
    log_path: PathBuf,
    port: u16,
    /// For a hot standby from [`Cluster::standby`]: the name it streams under (its
    /// `cluster_name`, hence its `application_name` on the primary) and of its replication
    /// slot there.
    standby_name: Option<String>,
    /// The postmaster we spawned, until it has exited and been reaped. A postmaster
    /// restarted by `pg_ctl` is not our child and is not tracked here. The lock also
    /// serialises control operations.
    child: Mutex<Option<Child>>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("bin_dir", &self.bin_dir)
            .field("data_dir", &self.data_dir)
            .field("port", &self.port)
            .field("standby_name", &self.standby_name)
            .finish_non_exhaustive()
    }
}

enum StartFailure {
    PortTaken,
    Failed(String),
}

impl Cluster {
    /// Creates and starts a new cluster; panics, with the tail of the server log, when it
    /// cannot be started.
    pub(crate) fn start(options: &Options) -> Cluster {
        let bin_dir = locate::bin_dir();
        let run_as = RunAs::get();
        let template = template(bin_dir, run_as);
        // From here on, a panic drops the cluster, which stops the server and removes its
        // directory.
        let cluster = Cluster::new(bin_dir, run_as, false);
        copy_tree(template, &cluster.data_dir, run_as).unwrap_or_else(|e| {
            panic!(
                "copying the initialised cluster {} to {}: {e}",
                template.display(),
                cluster.data_dir.display()
            )
        });
        cluster.boot(options)
    }

    /// Creates a hot standby of `primary`: a base backup taken with `pg_basebackup -R`
    /// (which writes `standby.signal` and `primary_conninfo`) through a replication slot of
    /// its own on the primary, started on a port of its own. Returns once it accepts
    /// connections, which a standby does once its data is consistent.
    pub(crate) fn standby(primary: &Cluster, options: &Options) -> Cluster {
        let cluster = Cluster::new(primary.bin_dir, primary.run_as, true);
        let name = cluster
            .standby_name
            .as_deref()
            .expect("a standby has a name");
        fs::create_dir(&cluster.data_dir)
            .and_then(|()| {
                fs::set_permissions(&cluster.data_dir, fs::Permissions::from_mode(0o700))
            })
            .and_then(|()| RunAs::chown(cluster.run_as, &cluster.data_dir))
            .unwrap_or_else(|e| panic!("creating {}: {e}", cluster.data_dir.display()));

        let mut command = cluster.command("pg_basebackup");
        command
            .args(["--host", "127.0.0.1", "--port"])
            .arg(primary.port.to_string())
            .args(["--username", SUPERUSER, "--pgdata"])
            .arg(&cluster.data_dir)
            .args([
                "--write-recovery-conf",
                "--wal-method=stream",
                "--checkpoint=fast",
                "--create-slot",
                "--slot",
                name,
                "--no-password",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !options.durable {
            command.arg("--no-sync");
        }
        let program = cluster.bin_dir.join("pg_basebackup");
        // Tied to this process like the servers, so that it cannot outlive it either.
        let output = process::spawn_tied_to_process_with(command, libc::SIGTERM)
            .and_then(Child::wait_with_output)
            .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
        if !output.status.success() {
            panic!(
                "{} failed ({}) for a standby of the server in {}:\n{}{}\n--- tail of {} ---\n{}",
                program.display(),
                output.status,
                primary.data_dir.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                primary.log_path.display(),
                primary.log_tail()
            );
        }
        cluster.boot(options)
    }

    /// A cluster not yet on disk: a fresh directory, with nothing in it yet.
    fn new(bin_dir: &'static Path, run_as: Option<RunAs>, standby: bool) -> Cluster {
        let dir = process::new_cluster_dir();
        // `standby_<pid>_<n>`, after the directory: unique on this machine, and usable
        // unquoted as an application_name and a replication slot's name.
        let standby_name = standby.then(|| {
            let base = dir
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            format!("standby_{}", base.replace('-', "_"))
        });
        Cluster {
            bin_dir,
            run_as,
            data_dir: dir.join("data"),
            log_path: dir.join(LOG_FILE),
            dir,
            port: 0,
            standby_name,
            child: Mutex::new(None),
        }
    }

    /// Creates the log, writes the settings and starts the postmaster on a free port,
    /// trying another port when the chosen one was taken meanwhile.
    fn boot(self, options: &Options) -> Cluster {
        let mut cluster = self;
        let bin_dir = cluster.bin_dir;
        File::create(&cluster.log_path)
            .and_then(|_| RunAs::chown(cluster.run_as, &cluster.log_path))
            .unwrap_or_else(|e| panic!("creating {}: {e}", cluster.log_path.display()));

        for _ in 0..PORT_ATTEMPTS {
            cluster.port = free_port();
            cluster.write_settings(options);
            let log_offset = fs::metadata(&cluster.log_path).map_or(0, |m| m.len());
            let child = cluster.spawn_postmaster();
            *cluster.lock_child() = Some(child);
            match cluster.wait_ready(log_offset) {
                Ok(()) => return cluster,
                Err(StartFailure::PortTaken) => {
                    let mut child = cluster.lock_child().take();
                    process::stop_postmaster(&cluster.data_dir, child.as_mut());
                }
                Err(StartFailure::Failed(reason)) => panic!(
                    "could not start PostgreSQL ({}) in {}: {reason}\n--- tail of {} ---\n{}",
                    bin_dir.display(),
                    cluster.data_dir.display(),
                    cluster.log_path.display(),
                    cluster.log_tail()
                ),
            }
        }
        panic!(
            "could not start PostgreSQL in {}: the chosen port was taken {PORT_ATTEMPTS} times \
             in a row\n--- tail of {} ---\n{}",
            cluster.data_dir.display(),
            cluster.log_path.display(),
            cluster.log_tail()
        )
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn bin_dir(&self) -> &Path {
        self.bin_dir
    }

    pub(crate) fn standby_name(&self) -> Option<&str> {
        self.standby_name.as_deref()
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        process::sanitize_env(&mut command);
        RunAs::apply(self.run_as, &mut command);
        command.current_dir(&self.dir).stdin(Stdio::null());
        command
    }

    fn write_settings(&self, options: &Options) {
        let mut settings = format!(
            "# Managed by platformkit-limit-testdb; rewritten on every start.\n\
             port = {port}\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = ''\n\
             max_connections = 300\n\
             max_prepared_transactions = 10\n\
             shared_buffers = 128MB\n\
             logging_collector = off\n\
             log_min_messages = warning\n",
            port = self.port
        );
        if let Some(name) = &self.standby_name {
            // A standby's walreceiver connects to the primary with its cluster_name as
            // application_name (pg_basebackup -R wrote a primary_conninfo without one): the
            // name synchronous_standby_names and pg_stat_replication know it by.
            settings.push_str(&format!(
                "# A hot standby, streaming from its primary.\n\
                 cluster_name = '{name}'\n\
                 hot_standby = on\n"
            ));
        }
        if !options.durable {
            settings.push_str(
                "# Throwaway data: trade crash safety for speed.\n\
                 fsync = off\n\
                 synchronous_commit = off\n\
                 full_page_writes = off\n",
            );
        }
        let path = self.data_dir.join(SETTINGS_FILE);
        fs::write(&path, settings)
            .and_then(|()| RunAs::chown(self.run_as, &path))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    fn spawn_postmaster(&self) -> Child {
        let log = OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log_path.display()));
        let log_for_stdout = log.try_clone().unwrap_or_else(|e| {
            panic!("duplicating the handle of {}: {e}", self.log_path.display())
        });
        let mut command = self.command("postgres");
        command
            .arg("-D")
            .arg(&self.data_dir)
            .stdout(log_for_stdout)
            .stderr(log);
        process::spawn_tied_to_process(command)
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.bin_dir.join("postgres").display()))
    }

    /// Waits until the postmaster reports itself ready in `postmaster.pid`.
    fn wait_ready(&self, log_offset: u64) -> Result<(), StartFailure> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child_pid = {
                let mut guard = self.lock_child();
                let Some(child) = guard.as_mut() else {
                    return Err(StartFailure::Failed("the server process is gone".into()));
                };
                if let Ok(Some(status)) = child.try_wait() {
                    *guard = None;
                    let log = read_from(&self.log_path, log_offset);
                    return Err(
                        if log.contains("could not bind") || log.contains("Address already in use")
                        {
                            StartFailure::PortTaken
                        } else {
                            StartFailure::Failed(format!(
                                "the server exited during startup ({status})"
                            ))
                        },
                    );
                }
                child.id()
            };
            if self.reports_ready(child_pid) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartFailure::Failed(format!(
                    "the server did not become ready within {} seconds",
                    READY_TIMEOUT.as_secs()
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Line 1 of `postmaster.pid` is the postmaster's pid, line 8 its status.
    fn reports_ready(&self, pid: u32) -> bool {
        let Ok(contents) = fs::read_to_string(self.data_dir.join("postmaster.pid")) else {
            return false;
        };
        let lines: Vec<&str> = contents.lines().collect();
        lines.first().map(|l| l.trim()) == Some(pid.to_string().as_str())
            && lines.get(7).map(|l| l.trim()) == Some("ready")
    }

    /// Runs `pg_ctl <args> -D <data>` as the cluster's account and waits for it.
    pub(crate) fn pg_ctl(&self, args: &[&str]) {
        let mut child = self.lock_child();
        let mut command = self.command("pg_ctl");
        command.args(args);
        let starts = args.iter().any(|a| *a == "start" || *a == "restart");
        let has_log = args.iter().any(|a| *a == "-l" || a.starts_with("--log"));
        if starts && !has_log {
            // Without a log file the new postmaster would inherit (and hold open) our pipes.
            command.arg("-l").arg(&self.log_path);
        }
        command.arg("-D").arg(&self.data_dir);
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bin_dir.join("pg_ctl").display()));
        // The postmaster we spawned may have been stopped: reap it.
        if matches!(child.as_mut().map(Child::try_wait), Some(Ok(Some(_)))) {
            *child = None;
        }
        drop(child);
        if !output.status.success() {
            panic!(
                "`pg_ctl {}` failed for the server in {} ({}):\n{}{}\n--- tail of {} ---\n{}",
                args.join(" "),
                self.data_dir.display(),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                self.log_path.display(),
                self.log_tail()
            );
        }
    }

    pub(crate) fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last lines of the server log, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        tail_of(&self.log_path)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut child = self.lock_child().take();
        process::stop_postmaster(&self.data_dir, child.as_mut());
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => eprintln!(
                "platformkit-limit-testdb: could not remove {}: {e}",
                self.dir.display()
            ),
            _ => {}
        }
    }
}

/// The last lines (at most 8 KiB) of the file at `path`, for error messages; empty when
/// it cannot be read.
pub(crate) fn tail_of(path: &Path) -> String {
    const MAX: u64 = 8 * 1024;
    let len = fs::metadata(path).map_or(0, |m| m.len());
    let tail = read_from(path, len.saturating_sub(MAX));
    if len > MAX {
        // Drop the first, probably partial, line.
        tail.split_once('\n')
            .map_or(tail.clone(), |(_, rest)| rest.to_owned())
    } else {
        tail
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap_or_else(|e| panic!("finding a free TCP port on 127.0.0.1: {e}"))
        .port()
}

pub(crate) fn read_from(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    if file.seek(SeekFrom::Start(offset)).is_ok() {
        let _ = file.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A freshly `initdb`-ed data directory, created once per process and copied for each
/// cluster (copying is an order of magnitude faster than running `initdb` again).
fn template(bin_dir: &Path, run_as: Option<RunAs>) -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = process::base_dir().join(format!("{}-template", std::process::id()));
        // Left over by a failed attempt earlier in this process.
        let _ = fs::remove_dir_all(&dir);
        let data = dir.join("data");
        fs::create_dir(&dir)
            .and_then(|()| fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)))
            .and_then(|()| fs::create_dir(&data))
            .and_then(|()| fs::set_permissions(&data, fs::Permissions::from_mode(0o700)))
            .and_then(|()| RunAs::chown(run_as, &data))
            .unwrap_or_else(|e| panic!("creating {}: {e}", data.display()));

        let initdb = bin_dir.join("initdb");
        let mut command = Command::new(&initdb);
        process::sanitize_env(&mut command);
        RunAs::apply(run_as, &mut command);
        command
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .current_dir(&dir)
            .stdin(Stdio::null());
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", initdb.display()));
        if !output.status.success() {
            panic!(
                "{} failed ({}) for {}:\n{}{}",
                initdb.display(),
                output.status,
                data.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }

        let conf = data.join("postgresql.conf");
        OpenOptions::new()
            .append(true)
            .open(&conf)
            .and_then(|mut file| {
                use std::io::Write;
                writeln!(file, "\ninclude '{SETTINGS_FILE}'")
            })
            .unwrap_or_else(|e| panic!("appending to {}: {e}", conf.display()));
        data
    })
}

/// Copies a directory tree, keeping permission bits and giving everything to `run_as`.
fn copy_tree(src: &Path, dst: &Path, run_as: Option<RunAs>) -> io::Result<()> {
    let metadata = fs::symlink_metadata(src)?;
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        fs::create_dir(dst)?;
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()), run_as)?;
        }
        fs::set_permissions(dst, fs::Permissions::from_mode(metadata.mode() & 0o7777))?;
    } else if file_type.is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src)?, dst)?;
        return RunAs::lchown(run_as, dst);
    } else {
        fs::copy(src, dst)?;
    }
    RunAs::chown(run_as, dst)
}
