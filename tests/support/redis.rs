//! Test harness: real `redis-server` processes on free loopback ports.
//!
//! It talks to the servers through redis-rs's synchronous client (the
//! `redis` the crate uses, as deadpool-redis pulls it in): a command answers
//! a redis-rs [`Value`], or a typed result through [`RedisServer::query`].
//!
//! # When Redis is not installed
//!
//! Every test that needs Redis starts with `require_redis();`, which
//! checks that `redis-server` and `redis-cli` can be run and **panics**
//! when they can't: "redis-server not found: run scripts/test.sh, which
//! installs it". A Redis test never passes without having run, in CI or
//! out of it.
//!
//! `scripts/test.sh` installs Redis (Debian `redis-server` + `redis-tools`).
//! `REDIS_SERVER_BIN` / `REDIS_CLI_BIN` override the binaries that are run.
//!
//! # What the servers look like
//!
//! * Each server listens on a free `127.0.0.1` port picked by the kernel
//!   (never 6379; the machine's own Redis service is never touched), with
//!   `--save "" --appendonly no --daemonize no`, its own fresh temp dir under
//!   [`std::env::temp_dir`] as `--dir`, and `redis.log` in that dir. Ports
//!   are always chosen so that `port + 10000` (the cluster bus) is free too.
//! * `--repl-diskless-sync-delay 0` is added so replicas sync at once
//!   (the default delays a full sync by 5 s), and on Redis >= 7
//!   `--enable-debug-command yes` so `DEBUG SLEEP` etc. work.
//! * Extra args given to [`RedisServer::start_with`] come last and so win.
//! * Dropping a [`RedisServer`] (or calling `stop()`) SIGKILLs it by PID,
//!   reaps it and removes its dir. Each server also has a tiny `sh` watchdog
//!   holding a pipe from the test process: if the test binary dies without
//!   running destructors (abort, SIGKILL, a server kept in a `static`), the
//!   watchdog kills the server and removes its dir when the pipe closes.
//! * Every wait is polled with a short backoff under a deadline; hitting the
//!   deadline panics with the tail of the server's log. Nothing sleeps a
//!   fixed amount and nothing can hang forever.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use ::redis::Value;
use ::redis::{
    Client, Cmd, Connection, ConnectionAddr, ConnectionInfo, ConnectionLike, FromRedisValue,
    IntoConnectionInfo, RedisConnectionInfo, RedisResult,
};

/// How long a server may take to answer PING after being spawned.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replica may take to sync, or a failover to complete.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `redis-cli --cluster create` plus convergence may take.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);
/// Default read/write timeout of one command on a harness connection.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(30);
/// How many fresh ports to try when another process steals the chosen one.
const PORT_ATTEMPTS: usize = 5;
/// Offset of the cluster bus port.
const BUS_OFFSET: u16 = 10000;
/// Lines of log shown in panic messages.
const LOG_TAIL_LINES: usize = 30;

// ---------------------------------------------------------------------------
// Availability
// ---------------------------------------------------------------------------

fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// `Ok(version)` if `redis-server` and `redis-cli` can be run, else why not.
fn redis_availability() -> &'static Result<(u32, u32, u32), String> {
    static AVAILABLE: OnceLock<Result<(u32, u32, u32), String>> = OnceLock::new();
    AVAILABLE.get_or_init(|| {
        let server = redis_server_bin();
        let out = Command::new(&server)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("`{server} --version` could not be run: {e}"))?;
        if !out.status.success() {
            return Err(format!("`{server} --version` failed: {}", out.status));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let cli = redis_cli_bin();
        let cli_ok = Command::new(&cli)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !cli_ok {
            return Err(format!("`{cli} --version` could not be run"));
        }
        Ok(parse_version(&text))
    })
}

/// Parses `Redis server v=7.0.15 sha=...`; unknown formats give `(0, 0, 0)`.
fn parse_version(text: &str) -> (u32, u32, u32) {
    let v = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("");
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// Version of the `redis-server` binary, e.g. `(7, 0, 15)`; panics, as
/// [`require_redis`] does, if it cannot be run.
#[track_caller]
pub fn redis_version() -> (u32, u32, u32) {
    match redis_availability() {
        Ok(v) => *v,
        Err(why) => missing("redis-server", why),
    }
}

/// Call at the top of every Redis test: panics unless `redis-server` and
/// `redis-cli` can be run.
#[track_caller]
pub fn require_redis() {
    redis_version();
}

/// The one answer to a missing tool: a panic that says how to get it.
#[track_caller]
pub fn missing(tool: &str, why: &str) -> ! {
    panic!("{tool} not found: run scripts/test.sh, which installs it ({why})")
}

// ---------------------------------------------------------------------------
// Polling helpers
// ---------------------------------------------------------------------------

/// Exponential backoff (2 ms .. 100 ms) under a deadline.
struct Backoff {
    deadline: Instant,
    delay: Duration,
}

impl Backoff {
    fn new(timeout: Duration) -> Self {
        Backoff {
            deadline: Instant::now() + timeout,
            delay: Duration::from_millis(2),
        }
    }

    /// Sleeps before the next poll; `false` once the deadline has passed.
    fn wait(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        thread::sleep(self.delay.min(self.deadline - now));
        self.delay = (self.delay * 2).min(Duration::from_millis(100));
        true
    }
}

/// Polls `probe` until it returns `Some`, for at most `timeout`; `None` after.
pub fn poll_until<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let mut backoff = Backoff::new(timeout);
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if !backoff.wait() {
            // One last look after the deadline.
            return probe();
        }
    }
}

/// Polls `probe` until it returns `Some`; panics with `context()` after `timeout`.
pub fn wait_until<T>(
    timeout: Duration,
    what: &str,
    probe: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    let started = Instant::now();
    poll_until(timeout, probe).unwrap_or_else(|| {
        panic!(
            "timed out after {:.1?} waiting for {what}\n{}",
            started.elapsed(),
            context()
        )
    })
}

fn port_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A kernel-chosen free port `p` with `p + 10000` also free (cluster bus),
/// never 6379/16379.
pub fn pick_free_port() -> u16 {
    for _ in 0..1000 {
        let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) else {
            continue;
        };
        let Ok(addr) = listener.local_addr() else {
            continue;
        };
        let port = addr.port();
        if port == 6379 || port > u16::MAX - BUS_OFFSET || port + BUS_OFFSET == 6379 {
            continue;
        }
        if port_free(port + BUS_OFFSET) {
            return port;
        }
    }
    panic!("could not find a free 127.0.0.1 port P with P+{BUS_OFFSET} also free");
}

/// Creates a fresh, unique directory under the system temp dir.
pub fn make_temp_dir(port: u16) -> PathBuf {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let base = std::env::temp_dir();
    for _ in 0..100 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "tower-ratelimit-redis-{}-{}-{port}-{nanos:x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create temp dir {}: {e}", dir.display()),
        }
    }
    panic!("cannot create a unique temp dir under {}", base.display());
}

/// Last `n` lines of a file ("" if unreadable).
pub fn file_tail(path: &Path, n: usize) -> String {
    let Ok(bytes) = fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Process state letter from `/proc/<pid>/stat` (`'T'` = stopped), if readable.
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run `kill -{signal} {pid}`: {e}"));
    assert!(status.success(), "`kill -{signal} {pid}` failed: {status}");
}

// ---------------------------------------------------------------------------
// Connections (redis-rs's synchronous client)
// ---------------------------------------------------------------------------

/// The harness's connection settings for `addr`: RESP2, and no `CLIENT
/// SETINFO` on connect, so that `MONITOR` and `INFO commandstats` show only
/// what a test sent.
pub fn connection_info(addr: ConnectionAddr) -> ConnectionInfo {
    addr.into_connection_info()
        .expect("a harness address is valid")
        .set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name())
}

/// A new connection to `addr` with these connect and read/write timeouts.
pub fn connect_with(
    addr: ConnectionAddr,
    connect: Duration,
    io: Duration,
) -> RedisResult<Connection> {
    let con = Client::open(connection_info(addr))?.get_connection_with_timeout(connect)?;
    con.set_read_timeout(Some(io))?;
    con.set_write_timeout(Some(io))?;
    Ok(con)
}

/// A new connection to `127.0.0.1:PORT` (2 s to connect, [`CMD_TIMEOUT`]
/// per command).
pub fn connect(addr: SocketAddr) -> RedisResult<Connection> {
    connect_with(tcp(addr), Duration::from_secs(2), CMD_TIMEOUT)
}

/// `addr` as a redis-rs TCP address.
pub fn tcp(addr: SocketAddr) -> ConnectionAddr {
    ConnectionAddr::Tcp(addr.ip().to_string(), addr.port())
}

/// The command `args` (name first) as redis-rs sends it.
pub fn command<A: AsRef<[u8]>>(args: &[A]) -> Cmd {
    let (name, rest) = args.split_first().expect("a command has a name");
    let mut cmd = ::redis::cmd(std::str::from_utf8(name.as_ref()).expect("a UTF-8 command name"));
    for arg in rest {
        cmd.arg(arg.as_ref());
    }
    cmd
}

/// Runs `args` on `con`. A Redis error reply is `Ok(Value::ServerError)`;
/// `Err` is a connection failure.
pub fn run<A: AsRef<[u8]>>(con: &mut Connection, args: &[A]) -> RedisResult<Value> {
    con.req_command(&command(args))
}

/// Runs `args` on a fresh connection to `addr`; see [`run`].
pub fn cmd_at<A: AsRef<[u8]>>(addr: SocketAddr, args: &[A]) -> RedisResult<Value> {
    run(&mut connect(addr)?, args)
}

/// One PING on a fresh connection with short timeouts: `true` on `PONG`.
pub fn ping_at(addr: ConnectionAddr) -> bool {
    let Ok(mut con) = connect_with(addr, Duration::from_millis(250), Duration::from_secs(1)) else {
        return false;
    };
    matches!(run(&mut con, &["PING"]), Ok(Value::SimpleString(s)) if s == "PONG")
}

/// `value` as a `T`, or a panic naming the command `args` that answered it.
#[track_caller]
pub fn convert<T: FromRedisValue>(value: Value, args: &[impl AsRef<[u8]>]) -> T {
    match ::redis::from_redis_value_ref(&value) {
        Ok(v) => v,
        Err(e) => panic!(
            "`{}` answered {value:?}, not a {}: {e}",
            display_args(args),
            std::any::type_name::<T>()
        ),
    }
}

/// The integer in `value` (an integer reply, or a string of one).
pub fn int(value: &Value) -> Option<i64> {
    ::redis::from_redis_value_ref(value).ok()
}

/// Panics unless `value` is `OK`, naming the command `what`.
#[track_caller]
pub fn assert_ok(value: Value, what: &str) {
    assert_eq!(value, Value::Okay, "{what}");
}

/// The text of a string reply (lossy UTF-8), if it is one.
pub fn text(value: &Value) -> Option<String> {
    match value {
        Value::SimpleString(s) => Some(s.clone()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn display_args<A: AsRef<[u8]>>(args: &[A]) -> String {
    args.iter()
        .map(|a| String::from_utf8_lossy(a.as_ref()).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parses `INFO` text into `key -> value` (section headers and blanks skipped).
pub fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Per-command counters from `INFO commandstats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommandStats {
    /// Executions, including ones that returned an error (e.g. NOSCRIPT).
    pub calls: u64,
    pub usec: u64,
    /// Rejected before execution (arity, OOM, ...): not in `calls`.
    pub rejected_calls: u64,
    /// Executed but returned an error: also counted in `calls`.
    pub failed_calls: u64,
}

fn commandstat_key(cmd: &str) -> String {
    format!(
        "cmdstat_{}",
        cmd.trim()
            .to_ascii_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join("|")
    )
}

fn parse_command_stats(value: &str) -> CommandStats {
    let mut stats = CommandStats::default();
    for field in value.split(',') {
        let Some((k, v)) = field.split_once('=') else {
            continue;
        };
        let v = v.parse().unwrap_or(0);
        match k {
            "calls" => stats.calls = v,
            "usec" => stats.usec = v,
            "rejected_calls" => stats.rejected_calls = v,
            "failed_calls" => stats.failed_calls = v,
            _ => {}
        }
    }
    stats
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

enum BootError {
    /// Somebody else got the port first; try another one.
    PortTaken(String),
    Fatal(String),
}

/// One real `redis-server` process on `127.0.0.1:port()`. Dropping it kills it.
pub struct RedisServer {
    port: u16,
    pid: u32,
    child: Option<Child>,
    watchdog: Option<Child>,
    dir: PathBuf,
    /// Extra args (after the harness' own), reused by `restart()`.
    args: Vec<String>,
    cluster: bool,
    paused: AtomicBool,
}

impl RedisServer {
    /// Starts a server with the default settings and waits for PING.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra config args, e.g.
    /// `&["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]`.
    pub fn start_with(args: &[&str]) -> Self {
        Self::spawn(args.iter().map(|s| (*s).to_owned()).collect(), false)
    }

    /// Starts a replica of `primary` (`--replicaof 127.0.0.1 PORT`). It is not
    /// necessarily synced yet: call `replica.wait_for_sync(&primary)`.
    pub fn replica_of(primary: &RedisServer) -> Self {
        Self::replica_of_with(primary, &[])
    }

    /// [`RedisServer::replica_of`] with extra config args.
    pub fn replica_of_with(primary: &RedisServer, args: &[&str]) -> Self {
        let mut all = vec![
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port.to_string(),
        ];
        all.extend(args.iter().map(|s| (*s).to_owned()));
        Self::spawn(all, false)
    }

    fn spawn(args: Vec<String>, cluster: bool) -> Self {
        require_redis();
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = pick_free_port();
            let mut server = RedisServer {
                port,
                pid: 0,
                child: None,
                watchdog: None,
                dir: make_temp_dir(port),
                args: args.clone(),
                cluster,
                paused: AtomicBool::new(false),
            };
            match server.boot() {
                Ok(()) => return server,
                Err(BootError::PortTaken(msg)) => last = msg, // drop cleans up
                Err(BootError::Fatal(msg)) => panic!("{msg}"),
            }
        }
        panic!("redis-server could not get a free port in {PORT_ATTEMPTS} attempts; last:\n{last}");
    }

    fn command_line(&self) -> Vec<String> {
        let dir = self.dir.display().to_string();
        let mut a: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            &dir,
            "--logfile",
            &self.log_path().display().to_string(),
            "--repl-diskless-sync-delay",
            "0",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if redis_version().0 >= 7 {
            a.extend(["--enable-debug-command".to_owned(), "yes".to_owned()]);
        }
        if self.cluster {
            a.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &self.dir.join("nodes.conf").display().to_string(),
                    "--cluster-node-timeout",
                    "2000",
                ]
                .iter()
                .map(|s| (*s).to_owned()),
            );
        }
        a.extend(self.args.iter().cloned());
        a
    }

    /// Spawns the process (port and dir already set) and waits for PING.
    fn boot(&mut self) -> Result<(), BootError> {
        let stdio_log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stdio_log_path())
            .map_err(|e| BootError::Fatal(format!("cannot create stdio log: {e}")))?;
        let stdio_err = stdio_log
            .try_clone()
            .map_err(|e| BootError::Fatal(format!("cannot clone stdio log: {e}")))?;
        let child = Command::new(redis_server_bin())
            .args(self.command_line())
            .stdin(Stdio::null())
            .stdout(stdio_log)
            .stderr(stdio_err)
            .spawn()
            .map_err(|e| BootError::Fatal(format!("cannot spawn {}: {e}", redis_server_bin())))?;
        self.pid = child.id();
        self.child = Some(child);
        self.paused.store(false, Ordering::SeqCst);
        self.watchdog = spawn_watchdog(self.pid, self.port, &self.dir);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), BootError> {
        let mut backoff = Backoff::new(START_TIMEOUT);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    self.kill_watchdog();
                    let log = self.log_tail(LOG_TAIL_LINES);
                    let msg = format!(
                        "redis-server on port {} exited during startup ({status})\n{log}",
                        self.port
                    );
                    return Err(if log.contains("Address already in use") {
                        BootError::PortTaken(msg)
                    } else {
                        BootError::Fatal(msg)
                    });
                }
            }
            if self.ping() {
                // Make sure it is *our* process that answers on this port.
                let pid = self
                    .try_cmd(&["INFO", "server"])
                    .ok()
                    .and_then(|r| text(&r))
                    .and_then(|s| parse_info(&s).get("process_id").cloned());
                match pid {
                    Some(p) if p == self.pid.to_string() => return Ok(()),
                    Some(p) => {
                        self.kill_process();
                        return Err(BootError::PortTaken(format!(
                            "port {} is answered by another redis (pid {p})",
                            self.port
                        )));
                    }
                    None => {} // LOADING or similar: keep polling
                }
            }
            if !backoff.wait() {
                let msg = format!(
                    "redis-server did not answer PING within {START_TIMEOUT:?}\n{}",
                    self.describe()
                );
                self.kill_process();
                return Err(BootError::Fatal(msg));
            }
        }
    }

    /// One PING on a fresh connection with short timeouts: `true` on `PONG`.
    pub fn ping(&self) -> bool {
        ping_at(tcp(self.addr()))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// PID of the current (or last) process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is alive (not killed/stopped by the harness).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The server's `--dir`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    fn stdio_log_path(&self) -> PathBuf {
        self.dir.join("stdio.log")
    }

    /// Last `n` lines of `redis.log` (and of stdout/stderr, if any).
    pub fn log_tail(&self, n: usize) -> String {
        let mut out = format!(
            "--- tail of {} ---\n{}",
            self.log_path().display(),
            file_tail(&self.log_path(), n)
        );
        let stdio = file_tail(&self.stdio_log_path(), n);
        if !stdio.trim().is_empty() {
            out.push_str(&format!("\n--- stdout/stderr ---\n{stdio}"));
        }
        out
    }

    fn describe(&self) -> String {
        format!(
            "redis-server pid {} on 127.0.0.1:{} (dir {})\n{}",
            self.pid,
            self.port,
            self.dir.display(),
            self.log_tail(LOG_TAIL_LINES)
        )
    }

    /// A new redis-rs connection to this server (panics if it cannot connect).
    #[track_caller]
    pub fn conn(&self) -> Connection {
        connect(self.addr()).unwrap_or_else(|e| {
            panic!(
                "cannot connect to {}: {e}\n{}",
                self.addr(),
                self.describe()
            )
        })
    }

    /// Runs one command on a fresh connection. A Redis error reply is
    /// `Ok(Value::ServerError)`; `Err` is a connection failure.
    pub fn try_cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> RedisResult<Value> {
        cmd_at(self.addr(), args)
    }

    /// Runs one command on a fresh connection; panics on connection errors
    /// (not on Redis errors, which come back as `Value::ServerError`).
    #[track_caller]
    pub fn cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Value {
        self.try_cmd(args).unwrap_or_else(|e| {
            panic!(
                "`{}` on 127.0.0.1:{} failed: {e}\n{}",
                display_args(args),
                self.port,
                self.describe()
            )
        })
    }

    /// Runs one command on a fresh connection and converts its reply, e.g.
    /// `server.query::<i64>(&["DBSIZE"])`; panics on any error, Redis's too.
    #[track_caller]
    pub fn query<T: FromRedisValue>(&self, args: &[impl AsRef<[u8]>]) -> T {
        convert(self.cmd(args), args)
    }

    /// `INFO <name>` as `key -> value`.
    #[track_caller]
    pub fn info_section(&self, name: &str) -> HashMap<String, String> {
        parse_info(&self.query::<String>(&["INFO", name]))
    }

    /// Counters of `cmd` from `INFO commandstats` (`None` if never called).
    /// `cmd` is case-insensitive; subcommands as `"script|load"` or `"SCRIPT LOAD"`.
    #[track_caller]
    pub fn command_stats(&self, cmd: &str) -> Option<CommandStats> {
        self.info_section("commandstats")
            .get(&commandstat_key(cmd))
            .map(|v| parse_command_stats(v))
    }

    /// `calls=` of `cmd` in `INFO commandstats`; 0 when absent.
    #[track_caller]
    pub fn command_calls(&self, cmd: &str) -> u64 {
        self.command_stats(cmd).map_or(0, |s| s.calls)
    }

    /// `CONFIG RESETSTAT` (zeroes commandstats, errorstats, ...).
    #[track_caller]
    pub fn config_resetstat(&self) {
        assert_ok(self.cmd(&["CONFIG", "RESETSTAT"]), "CONFIG RESETSTAT");
    }

    /// `CONFIG SET key value`.
    #[track_caller]
    pub fn config_set(&self, key: &str, value: &str) {
        assert_ok(
            self.cmd(&["CONFIG", "SET", key, value]),
            &format!("CONFIG SET {key} {value}"),
        );
    }

    /// `FLUSHALL`.
    #[track_caller]
    pub fn flushall(&self) {
        assert_ok(self.cmd(&["FLUSHALL"]), "FLUSHALL");
    }

    /// All keys matching `pattern` (via SCAN), sorted.
    #[track_caller]
    pub fn scan_keys(&self, pattern: &str) -> Vec<String> {
        let mut conn = self.conn();
        let mut cursor = "0".to_owned();
        let mut keys = Vec::new();
        loop {
            let args = ["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"];
            let reply = run(&mut conn, &args).unwrap_or_else(|e| panic!("SCAN failed: {e}"));
            let (next, page): (String, Vec<String>) = convert(reply, &args);
            cursor = next;
            keys.extend(page);
            if cursor == "0" {
                break;
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// `role` from `INFO replication` (`"master"` / `"slave"`), if reachable.
    pub fn role(&self) -> Option<String> {
        let text = text(&self.try_cmd(&["INFO", "replication"]).ok()?)?;
        parse_info(&text).remove("role")
    }

    /// Waits until this replica's link to `primary` is up and its offset
    /// has caught up with the primary's `master_repl_offset` (read first, at
    /// each poll): everything written to the primary before the call is then
    /// on the replica. Works for [`RedisServer::replica_of`] and after a
    /// `REPLICAOF` command.
    #[track_caller]
    pub fn wait_for_sync(&self, primary: &RedisServer) {
        wait_for_replica_sync(self, primary.addr());
    }

    /// Keys (matching `*`) that have no TTL (`PTTL` = -1), sorted.
    #[track_caller]
    pub fn keys_without_ttl(&self) -> Vec<String> {
        let keys = self.scan_keys("*");
        let mut conn = self.conn();
        let mut missing = Vec::new();
        for chunk in keys.chunks(500) {
            let mut pipe = ::redis::pipe();
            for key in chunk {
                pipe.cmd("PTTL").arg(key);
            }
            let ttls: Vec<i64> = pipe
                .query(&mut conn)
                .unwrap_or_else(|e| panic!("PTTL failed: {e}"));
            // -2: expired/deleted since SCAN; -1: no TTL.
            missing.extend(
                chunk
                    .iter()
                    .zip(ttls)
                    .filter(|(_, ttl)| *ttl == -1)
                    .map(|(key, _)| key.clone()),
            );
        }
        missing
    }

    /// Every key (matching `*`) with its `PTTL` in ms (-1: none), sorted by key.
    #[track_caller]
    pub fn ttls(&self) -> Vec<(String, i64)> {
        let mut keys = self.scan_keys("*");
        keys.sort();
        let mut conn = self.conn();
        keys.into_iter()
            .filter_map(|key| {
                let args = ["PTTL", key.as_str()];
                let reply = run(&mut conn, &args).unwrap_or_else(|e| panic!("PTTL failed: {e}"));
                // -2: expired or deleted since SCAN.
                let ttl: i64 = convert(reply, &args);
                (ttl != -2).then_some((key, ttl))
            })
            .collect()
    }

    /// Redis's own clock (`TIME`), Unix ms.
    #[track_caller]
    pub fn time_ms(&self) -> u64 {
        let (secs, micros): (u64, u64) = self.query(&["TIME"]);
        secs * 1_000 + micros / 1_000
    }

    /// Moves every score of the sorted set `key` (concurrency leases, which
    /// Redis's clock times) by `by_ms`: `-lease` is Redis's clock a lease
    /// later, as far as those leases go. Redis's clock itself cannot be
    /// moved (libfaketime does not run redis-server).
    #[track_caller]
    pub fn shift_scores(&self, key: &str, by_ms: i64) {
        let members: Vec<(String, i64)> = self.query(&["ZRANGE", key, "0", "-1", "WITHSCORES"]);
        for (member, score) in members {
            self.query::<i64>(&["ZADD", key, "XX", &(score + by_ms).to_string(), &member]);
        }
    }

    /// Starts a `MONITOR` connection; see [`Monitor`].
    #[track_caller]
    pub fn monitor(&self) -> Monitor {
        Monitor::start(self)
    }

    /// Sends SIGKILL to the process and reaps it; keeps the dir (so
    /// [`RedisServer::restart`] can reuse it, e.g. a cluster's nodes.conf).
    pub fn kill(&mut self) {
        self.kill_process();
    }

    fn kill_process(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL; works on SIGSTOPped processes too
            let _ = child.wait();
        }
        self.paused.store(false, Ordering::SeqCst);
        self.kill_watchdog();
    }

    fn kill_watchdog(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }

    /// Kills the process (SIGKILL by PID, then reaps it) and removes the dir.
    /// Idempotent; [`Drop`] does the same.
    pub fn stop(&mut self) {
        self.kill_process();
        let _ = fs::remove_dir_all(&self.dir);
    }

    /// Kills the process (if running) and starts a new one on the SAME port
    /// with the same args and dir, waiting until the port is free and then
    /// until it answers PING. Data is lost (no persistence).
    #[track_caller]
    pub fn restart(&mut self) {
        self.kill_process();
        let port = self.port;
        let cluster = self.cluster;
        wait_until(
            START_TIMEOUT,
            &format!("port {port} to become free for restart"),
            || (port_free(port) && (!cluster || port_free(port + BUS_OFFSET))).then_some(()),
            || self.describe(),
        );
        fs::create_dir_all(&self.dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", self.dir.display()));
        match self.boot() {
            Ok(()) => {}
            Err(BootError::PortTaken(msg) | BootError::Fatal(msg)) => {
                panic!("restart of redis-server on port {port} failed: {msg}")
            }
        }
    }

    /// SIGSTOP: the server keeps its sockets (the kernel still accepts
    /// connections) but answers nothing until [`RedisServer::resume`].
    /// Waits until the kernel reports the process stopped.
    #[track_caller]
    pub fn pause(&self) {
        assert!(self.child.is_some(), "pause(): server is not running");
        send_signal(self.pid, "STOP");
        self.paused.store(true, Ordering::SeqCst);
        let pid = self.pid;
        if proc_state(pid).is_some() {
            wait_until(
                START_TIMEOUT,
                &format!("pid {pid} to be stopped"),
                || (proc_state(pid) == Some('T')).then_some(()),
                || self.describe(),
            );
        }
    }

    /// SIGCONT, then waits until the server answers PING again.
    #[track_caller]
    pub fn resume(&self) {
        assert!(self.child.is_some(), "resume(): server is not running");
        send_signal(self.pid, "CONT");
        self.paused.store(false, Ordering::SeqCst);
        wait_until(
            START_TIMEOUT,
            "PING after SIGCONT",
            || self.ping().then_some(()),
            || self.describe(),
        );
    }

    /// Polls `INFO replication` until `role` is `role` (`"master"`, or
    /// `"slave"`/`"replica"`), e.g. after `FAILOVER` or `REPLICAOF NO ONE`.
    #[track_caller]
    pub fn wait_for_role(&self, role: &str) {
        let want = if role == "replica" { "slave" } else { role };
        wait_until(
            SYNC_TIMEOUT,
            &format!("127.0.0.1:{} to report role:{want}", self.port),
            || (self.role().as_deref() == Some(want)).then_some(()),
            || {
                format!(
                    "INFO replication: {:?}\n{}",
                    self.try_cmd(&["INFO", "replication"]).ok(),
                    self.describe()
                )
            },
        );
    }

    /// Waits until the only client connected is the harness's own probe:
    /// every other connection was closed (by the server's `timeout`, a kill,
    /// or its owner).
    #[track_caller]
    pub fn wait_for_no_other_clients(&self) {
        wait_until(
            SYNC_TIMEOUT,
            &format!("127.0.0.1:{} to have no other clients", self.port),
            || (self.info_section("clients")["connected_clients"] == "1").then_some(()),
            || self.describe(),
        );
    }

    /// A cheap, `Clone + Send` handle for sending commands from other threads
    /// (e.g. a blocking `EVAL` in a spawned thread). It does not own the process.
    pub fn clone_client(&self) -> RedisClient {
        RedisClient {
            addr: self.addr(),
            log_path: self.log_path(),
        }
    }
}

/// Command handle to a [`RedisServer`] that can move to other threads; see
/// [`RedisServer::clone_client`]. Each command uses a fresh connection.
#[derive(Clone, Debug)]
pub struct RedisClient {
    addr: SocketAddr,
    log_path: PathBuf,
}

impl RedisClient {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// A new redis-rs connection (panics if it cannot connect).
    #[track_caller]
    pub fn conn(&self) -> Connection {
        connect(self.addr).unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.addr))
    }

    /// Like [`RedisServer::try_cmd`].
    pub fn try_cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> RedisResult<Value> {
        cmd_at(self.addr, args)
    }

    /// Like [`RedisServer::cmd`]: panics on connection errors, not on Redis errors.
    #[track_caller]
    pub fn cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Value {
        self.try_cmd(args).unwrap_or_else(|e| {
            panic!(
                "`{}` on {} failed: {e}\n--- tail of {} ---\n{}",
                display_args(args),
                self.addr,
                self.log_path.display(),
                file_tail(&self.log_path, LOG_TAIL_LINES)
            )
        })
    }

    /// Like [`RedisServer::query`].
    #[track_caller]
    pub fn query<T: FromRedisValue>(&self, args: &[impl AsRef<[u8]>]) -> T {
        convert(self.cmd(args), args)
    }

    /// `INFO <name>` as `key -> value`.
    #[track_caller]
    pub fn info_section(&self, name: &str) -> HashMap<String, String> {
        parse_info(&self.query::<String>(&["INFO", name]))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if thread::panicking() && self.child.is_some() {
            eprintln!(
                "[redis harness] test panicked; redis-server pid {} on port {}:\n{}",
                self.pid,
                self.port,
                self.log_tail(10)
            );
        }
        self.stop();
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid)
            .field("dir", &self.dir)
            .field("running", &self.child.is_some())
            .field("paused", &self.is_paused())
            .finish()
    }
}

// ---------------------------------------------------------------------------
// MONITOR
// ---------------------------------------------------------------------------

/// One command seen by `MONITOR`.
#[derive(Clone, Debug, PartialEq)]
pub struct MonitorEntry {
    pub timestamp: f64,
    pub db: u32,
    /// `"127.0.0.1:PORT"` for a client, `"lua"` for `redis.call` inside a script.
    pub source: String,
    /// Command and arguments as sent (the command's case as sent).
    pub args: Vec<String>,
}

impl MonitorEntry {
    /// Whether it was run by a Lua script (`redis.call`), not sent by a client.
    pub fn is_from_script(&self) -> bool {
        self.source == "lua"
    }

    /// The command name, upper-cased.
    pub fn command(&self) -> String {
        self.args
            .first()
            .map(|c| c.to_ascii_uppercase())
            .unwrap_or_default()
    }
}

/// Records every command the server executes (via `MONITOR`), in a thread.
///
/// Why: `INFO commandstats` and `total_commands_processed` also count the
/// commands a Lua script runs with `redis.call` (an EVALSHA doing HMGET +
/// HSET + PEXPIREAT counts 4 calls), so "one round trip per request" can only
/// be checked by looking at what *clients* sent:
///
/// ```ignore
/// let monitor = server.monitor();
/// // ... traffic ...
/// let sent: Vec<_> = monitor.stop().into_iter().filter(|e| !e.is_from_script()).collect();
/// ```
///
/// `MONITOR` itself and `stop()`'s marker (`ECHO`) show up in commandstats;
/// admin commands such as `CONFIG` are not shown by `MONITOR`.
///
/// redis-rs has no synchronous monitor: the thread reads the `MONITOR`
/// lines from a redis-rs connection with `recv_response`, as redis-rs
/// documents for `MONITOR`, and ends when it reads this monitor's `ECHO`
/// marker (or the server goes away).
pub struct Monitor {
    entries: Arc<Mutex<Vec<MonitorEntry>>>,
    reader: Option<JoinHandle<()>>,
    server_addr: SocketAddr,
    marker: String,
}

impl Monitor {
    fn start(server: &RedisServer) -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let marker = format!(
            "tower-ratelimit-monitor-stop-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = server.conn();
        let reply = run(&mut conn, &["MONITOR"]).unwrap_or_else(|e| panic!("MONITOR failed: {e}"));
        assert_ok(reply, "MONITOR");
        // No read timeout: a timeout would drop the next line (redis-rs skips
        // a reply that came too late).
        conn.set_read_timeout(None)
            .expect("clear the MONITOR read timeout");
        let entries = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&entries);
        let end = marker.clone();
        let handle = thread::spawn(move || {
            while let Ok(Value::SimpleString(line)) = conn.recv_response() {
                let Some(entry) = parse_monitor_line(&line) else {
                    continue;
                };
                let last = entry.args.len() == 2 && entry.args[1] == end;
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
                if last {
                    break;
                }
            }
        });
        Monitor {
            entries,
            reader: Some(handle),
            server_addr: server.addr(),
            marker,
        }
    }

    /// Entries recorded so far (commands in flight may still be missing).
    pub fn snapshot(&self) -> Vec<MonitorEntry> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops monitoring and returns everything executed before the call:
    /// sends an `ECHO` marker on another connection and reads until it shows
    /// up, so nothing that completed before `stop()` is missed.
    #[track_caller]
    pub fn stop(mut self) -> Vec<MonitorEntry> {
        let marker = self.marker.clone();
        let reply = cmd_at(self.server_addr, &["ECHO", marker.as_str()])
            .unwrap_or_else(|e| panic!("ECHO marker to {} failed: {e}", self.server_addr));
        assert_eq!(text(&reply).as_deref(), Some(marker.as_str()));
        let is_marker = |e: &MonitorEntry| e.args.len() == 2 && e.args[1] == marker;
        let entries = Arc::clone(&self.entries);
        let found = wait_until(
            START_TIMEOUT,
            "the MONITOR stop marker",
            || {
                let list = entries.lock().unwrap_or_else(|p| p.into_inner());
                list.iter().position(is_marker).map(|i| list[..i].to_vec())
            },
            || format!("MONITOR on {} saw no marker", self.server_addr),
        );
        // The reader ends on the marker it just read.
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
        found
    }
}

impl Drop for Monitor {
    /// Without `stop()`: sends the marker so the reader ends, without
    /// waiting for it (the server may be paused or gone; the reader then
    /// ends with its connection).
    fn drop(&mut self) {
        if self.reader.take().is_some() {
            let _ = connect_with(
                tcp(self.server_addr),
                Duration::from_millis(250),
                Duration::from_secs(1),
            )
            .and_then(|mut c| run(&mut c, &["ECHO", self.marker.as_str()]));
        }
    }
}

/// Parses `1700000000.123456 [0 127.0.0.1:50000] "SET" "k" "v"`.
fn parse_monitor_line(line: &str) -> Option<MonitorEntry> {
    let (ts, rest) = line.split_once(' ')?;
    let rest = rest.strip_prefix('[')?;
    let (inside, rest) = rest.split_once(']')?;
    let (db, source) = inside.split_once(' ')?;
    let mut args = Vec::new();
    let mut chars = rest.trim_start().chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue; // separators between quoted args
        }
        let mut bytes = Vec::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => bytes.push(b'\n'),
                    'r' => bytes.push(b'\r'),
                    't' => bytes.push(b'\t'),
                    'a' => bytes.push(7),
                    'b' => bytes.push(8),
                    'x' => {
                        let hex: String = [chars.next()?, chars.next()?].iter().collect();
                        bytes.push(u8::from_str_radix(&hex, 16).ok()?);
                    }
                    other => {
                        let mut buf = [0; 4];
                        bytes.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                    }
                },
                other => {
                    let mut buf = [0; 4];
                    bytes.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        args.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    Some(MonitorEntry {
        timestamp: ts.parse().ok()?,
        db: db.parse().ok()?,
        source: source.to_owned(),
        args,
    })
}

/// Panics, listing them, if any key on `server` has no TTL (`PTTL` = -1):
/// a rate limiter must never leave immortal keys behind.
#[track_caller]
pub fn assert_every_key_has_a_ttl(server: &RedisServer) {
    let missing = server.keys_without_ttl();
    assert!(
        missing.is_empty(),
        "{} key(s) on 127.0.0.1:{} have no TTL: {:?}",
        missing.len(),
        server.port(),
        &missing[..missing.len().min(20)]
    );
}

/// `sh` process that SIGKILLs `pid` and removes `dir` once its stdin (a pipe
/// held by this test process only) closes, i.e. when the test binary exits
/// without running `Drop`. Killed by the harness on normal teardown.
///
/// Guards against PID reuse by checking that the process' command line still
/// mentions our port (`--port N` before Redis retitles itself, then
/// `redis-server 127.0.0.1:N`). `comm` can't be used: right after `spawn()`
/// it may still be the parent's (the kernel wakes a vfork parent before it
/// renames the child during exec).
pub fn spawn_watchdog(pid: u32, port: u16, dir: &Path) -> Option<Child> {
    let script = r#"read -r _ || true
if [ ! -d /proc/self ]; then
  kill -9 "$1" 2>/dev/null
else
  case " $(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null) " in
    *[!0-9]"$2"[!0-9]*) kill -9 "$1" 2>/dev/null ;;
  esac
fi
rm -rf -- "$3""#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("redis-watchdog")
        .arg(pid.to_string())
        .arg(port.to_string())
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

fn wait_for_replica_sync(replica: &RedisServer, primary: SocketAddr) {
    let offset = |addr: SocketAddr, field: &str| -> Option<(u64, HashMap<String, String>)> {
        let text = text(&cmd_at(addr, &["INFO", "replication"]).ok()?)?;
        let info = parse_info(&text);
        Some((info.get(field)?.parse().ok()?, info))
    };
    wait_until(
        SYNC_TIMEOUT,
        &format!("replica 127.0.0.1:{} to sync with {primary}", replica.port),
        || {
            // Primary first: once the replica has processed at least this
            // offset, everything written before this call is on the replica.
            let (target, _) = offset(primary, "master_repl_offset")?;
            let (done, info) = offset(replica.addr(), "slave_repl_offset")?;
            let up = info.get("master_link_status").map(String::as_str) == Some("up");
            (up && done >= target).then_some(())
        },
        || {
            format!(
                "replica INFO replication: {:?}\n{}",
                replica.try_cmd(&["INFO", "replication"]).ok(),
                replica.describe()
            )
        },
    );
}

// ---------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
struct NodeLine {
    id: String,
    port: u16,
    flags: Vec<String>,
    master_id: String,
}

fn parse_cluster_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            // ip:port@cport[,hostname]
            let hostport = f[1].split('@').next()?;
            let port = hostport.rsplit_once(':')?.1.parse().ok()?;
            Some(NodeLine {
                id: f[0].to_owned(),
                port,
                flags: f[2].split(',').map(str::to_owned).collect(),
                master_id: f[3].to_owned(),
            })
        })
        .collect()
}

/// A Redis Cluster of real processes (`--cluster-node-timeout 2000`).
pub struct Cluster {
    nodes: Vec<RedisServer>,
    masters: usize,
    replicas_per_master: usize,
}

impl Cluster {
    /// Starts `masters` (>= 3) masters with `replicas_per_master` replicas
    /// each, creates the cluster with `redis-cli --cluster create`, and waits
    /// until every node reports `cluster_state:ok`, all 16384 slots assigned,
    /// every node knows every other node and every replica is linked.
    pub fn start(masters: usize, replicas_per_master: usize) -> Self {
        Self::start_with(masters, replicas_per_master, &[])
    }

    /// [`Cluster::start`] with extra config args for every node.
    pub fn start_with(masters: usize, replicas_per_master: usize, args: &[&str]) -> Self {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        let total = masters * (1 + replicas_per_master);
        let nodes: Vec<RedisServer> = (0..total)
            .map(|_| RedisServer::spawn(args.clone(), true))
            .collect();
        let cluster = Cluster {
            nodes,
            masters,
            replicas_per_master,
        };
        cluster.create();
        cluster.wait_healthy();
        cluster
    }

    fn create(&self) {
        let log_path = self.nodes[0].dir().join("cluster-create.log");
        let log = fs::File::create(&log_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
        let log_err = log.try_clone().expect("clone log file");
        let mut cmd = Command::new(redis_cli_bin());
        cmd.arg("--cluster").arg("create");
        for n in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port()));
        }
        cmd.arg("--cluster-replicas")
            .arg(self.replicas_per_master.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", redis_cli_bin()));
        let mut backoff = Backoff::new(CLUSTER_TIMEOUT);
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break status;
            }
            if !backoff.wait() {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-cli --cluster create did not finish within {CLUSTER_TIMEOUT:?}:\n{}\n{}",
                    file_tail(&log_path, 60),
                    self.describe("create timed out")
                );
            }
        };
        assert!(
            status.success(),
            "redis-cli --cluster create failed ({status}):\n{}\n{}",
            file_tail(&log_path, 60),
            self.nodes[0].log_tail(LOG_TAIL_LINES)
        );
    }

    /// Problems (if any) that keep the cluster from being healthy.
    fn health_problems(&self) -> Vec<String> {
        let total = self.nodes.len();
        let expect_replicas = self.masters * self.replicas_per_master;
        let mut problems = Vec::new();
        for node in &self.nodes {
            let p = node.port();
            let info = match node.try_cmd(&["CLUSTER", "INFO"]).map(|r| text(&r)) {
                Ok(Some(text)) => parse_info(&text),
                other => {
                    problems.push(format!("{p}: CLUSTER INFO -> {other:?}"));
                    continue;
                }
            };
            let get = |k: &str| info.get(k).cloned().unwrap_or_default();
            if get("cluster_state") != "ok" {
                problems.push(format!("{p}: cluster_state:{}", get("cluster_state")));
            }
            if get("cluster_slots_assigned") != "16384" || get("cluster_slots_ok") != "16384" {
                problems.push(format!(
                    "{p}: slots assigned {} ok {}",
                    get("cluster_slots_assigned"),
                    get("cluster_slots_ok")
                ));
            }
            if get("cluster_known_nodes") != total.to_string() {
                problems.push(format!("{p}: knows {} nodes", get("cluster_known_nodes")));
            }
            let lines = match node.try_cmd(&["CLUSTER", "NODES"]).map(|r| text(&r)) {
                Ok(Some(text)) => parse_cluster_nodes(&text),
                other => {
                    problems.push(format!("{p}: CLUSTER NODES -> {other:?}"));
                    continue;
                }
            };
            let bad: Vec<_> = lines
                .iter()
                .filter(|l| {
                    l.flags
                        .iter()
                        .any(|f| matches!(f.as_str(), "fail" | "fail?" | "handshake" | "noaddr"))
                })
                .map(|l| format!("{}:{}", l.port, l.flags.join(",")))
                .collect();
            if !bad.is_empty() {
                problems.push(format!("{p}: sees {bad:?}"));
            }
            let replicas = lines
                .iter()
                .filter(|l| l.flags.iter().any(|f| f == "slave"))
                .count();
            if replicas != expect_replicas {
                problems.push(format!("{p}: sees {replicas} replicas"));
            }
            match node.try_cmd(&["INFO", "replication"]).map(|r| text(&r)) {
                Ok(Some(text)) => {
                    let repl = parse_info(&text);
                    if repl.get("role").map(String::as_str) == Some("slave")
                        && repl.get("master_link_status").map(String::as_str) != Some("up")
                    {
                        problems.push(format!("{p}: replica link not up"));
                    }
                }
                other => problems.push(format!("{p}: INFO replication -> {other:?}")),
            }
        }
        problems
    }

    /// Waits until every node is healthy (see [`Cluster::start`]).
    #[track_caller]
    pub fn wait_healthy(&self) {
        let mut last = Vec::new();
        wait_until(
            CLUSTER_TIMEOUT,
            "the cluster to become healthy",
            || {
                last = self.health_problems();
                last.is_empty().then_some(())
            },
            || self.describe(&format!("{:?}", self.health_problems())),
        );
    }

    /// Waits until every *running* node reports `cluster_state:ok` with all
    /// 16384 slots ok and, in its `CLUSTER SLOTS`, every slot served by a
    /// running, unpaused node — e.g. after `node_mut(i).kill()` of a master, until a
    /// replica has been promoted automatically (`cluster-node-timeout` 2 s).
    #[track_caller]
    pub fn wait_state_ok(&self) {
        let problems = || -> Vec<String> {
            let mut problems = Vec::new();
            for n in self
                .nodes
                .iter()
                .filter(|n| n.child.is_some() && !n.is_paused())
            {
                let info = n
                    .try_cmd(&["CLUSTER", "INFO"])
                    .ok()
                    .and_then(|r| text(&r))
                    .map(|t| parse_info(&t))
                    .unwrap_or_default();
                let get = |k: &str| info.get(k).cloned().unwrap_or_default();
                if get("cluster_state") != "ok" || get("cluster_slots_ok") != "16384" {
                    problems.push(format!(
                        "{}: cluster_state:{} slots_ok:{}",
                        n.port(),
                        get("cluster_state"),
                        get("cluster_slots_ok")
                    ));
                    continue;
                }
                // Right after a kill the cluster still says ok until
                // cluster-node-timeout passes: also require that every
                // slot is served by a node that is actually up.
                match n.try_cmd(&["CLUSTER", "SLOTS"]) {
                    Ok(Value::Array(ranges)) => {
                        let mut served = 0;
                        for range in &ranges {
                            let r = match range {
                                Value::Array(r) if r.len() >= 3 => r,
                                _ => continue,
                            };
                            let port = match &r[2] {
                                Value::Array(m) if m.len() >= 2 => int(&m[1]),
                                _ => None,
                            };
                            let up = self.nodes.iter().any(|x| {
                                Some(i64::from(x.port())) == port
                                    && x.child.is_some()
                                    && !x.is_paused()
                            });
                            if up {
                                served += int(&r[1]).unwrap_or(-1) - int(&r[0]).unwrap_or(0) + 1;
                            }
                        }
                        if served != 16384 {
                            problems.push(format!("{}: {served} slots on live masters", n.port()));
                        }
                    }
                    other => problems.push(format!("{}: CLUSTER SLOTS -> {other:?}", n.port())),
                }
            }
            problems
        };
        wait_until(
            CLUSTER_TIMEOUT,
            "cluster_state:ok on every running node",
            || problems().is_empty().then_some(()),
            || self.describe(&format!("{:?}", problems())),
        );
    }

    fn describe(&self, problems: &str) -> String {
        let mut out = format!("problems: {problems}\n");
        for n in &self.nodes {
            out.push_str(&format!(
                "node 127.0.0.1:{} pid {}:\n{}\n",
                n.port(),
                n.pid(),
                n.log_tail(8)
            ));
        }
        out
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// Mutable access, e.g. to `kill()`, `pause()` or `restart()` one node.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// URLs of all nodes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Indices (into `nodes()`) of nodes that currently report `role:master`.
    pub fn master_indices(&self) -> Vec<usize> {
        self.indices_with_role("master")
    }

    /// Indices (into `nodes()`) of nodes that currently report `role:slave`.
    pub fn replica_indices(&self) -> Vec<usize> {
        self.indices_with_role("slave")
    }

    fn indices_with_role(&self, role: &str) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].child.is_some() && !self.nodes[i].is_paused())
            .filter(|&i| self.nodes[i].role().as_deref() == Some(role))
            .collect()
    }

    /// URLs of the nodes that are currently masters.
    pub fn master_urls(&self) -> Vec<String> {
        self.master_indices()
            .into_iter()
            .map(|i| self.nodes[i].url())
            .collect()
    }

    /// The node currently serving `key`'s slot (per `CLUSTER SLOTS`).
    #[track_caller]
    pub fn master_for_key(&self, key: &str) -> &RedisServer {
        let any = &self.nodes[self.master_indices()[0]];
        let slot: i64 = any.query(&["CLUSTER", "KEYSLOT", key]);
        let slots: Vec<Vec<Value>> = any.query(&["CLUSTER", "SLOTS"]);
        for r in &slots {
            let (start, end) = (int(&r[0]), int(&r[1]));
            if start.is_some_and(|s| s <= slot) && end.is_some_and(|e| slot <= e) {
                let master: Vec<Value> = convert(r[2].clone(), &["CLUSTER", "SLOTS"]);
                let port = int(&master[1]).expect("a port");
                return self
                    .nodes
                    .iter()
                    .find(|n| i64::from(n.port()) == port)
                    .unwrap_or_else(|| panic!("slot {slot} served by unknown port {port}"));
            }
        }
        panic!("slot {slot} of {key:?} is not served: {slots:?}");
    }

    /// Sum of [`RedisServer::command_calls`] over all running nodes.
    pub fn command_calls(&self, cmd: &str) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some() && !n.is_paused())
            .map(|n| n.command_calls(cmd))
            .sum()
    }

    /// `CONFIG RESETSTAT` on all running nodes.
    pub fn config_resetstat(&self) {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some() && !n.is_paused())
            .for_each(RedisServer::config_resetstat);
    }

    /// `FLUSHALL` on every master.
    pub fn flushall(&self) {
        for i in self.master_indices() {
            self.nodes[i].flushall();
        }
    }

    /// Manual failover: runs `CLUSTER FAILOVER` on the `replica_index`-th
    /// current replica (position in [`Cluster::replica_indices`]), waits until
    /// it reports `role:master`, every node sees it as master and its old
    /// master as a replica, the old master's link is up and every node is
    /// `cluster_state:ok`. Returns the promoted node's index into `nodes()`.
    #[track_caller]
    pub fn failover(&self, replica_index: usize) -> usize {
        let replicas = self.replica_indices();
        let Some(&node_index) = replicas.get(replica_index) else {
            panic!(
                "failover({replica_index}): only {} replicas: {replicas:?}",
                replicas.len()
            );
        };
        self.failover_node(node_index);
        node_index
    }

    /// Like [`Cluster::failover`], with the replica given as an index into `nodes()`.
    #[track_caller]
    pub fn failover_node(&self, node_index: usize) {
        let node = &self.nodes[node_index];
        let my_id: String = node.query(&["CLUSTER", "MYID"]);
        let lines = parse_cluster_nodes(&node.query::<String>(&["CLUSTER", "NODES"]));
        let me = lines
            .iter()
            .find(|l| l.id == my_id)
            .expect("node missing from its own CLUSTER NODES");
        assert!(
            me.flags.iter().any(|f| f == "slave"),
            "failover: node {node_index} (port {}) is not a replica: {:?}",
            node.port(),
            me.flags
        );
        let old_master_id = me.master_id.clone();
        let old_master = lines
            .iter()
            .find(|l| l.id == old_master_id)
            .and_then(|l| self.nodes.iter().find(|n| n.port() == l.port));

        let done = || -> bool {
            if node.role().as_deref() != Some("master") {
                return false;
            }
            if let Some(old) = old_master {
                let Some(text) = old
                    .try_cmd(&["INFO", "replication"])
                    .ok()
                    .and_then(|r| text(&r))
                else {
                    return false;
                };
                let repl = parse_info(&text);
                if repl.get("role").map(String::as_str) != Some("slave")
                    || repl.get("master_link_status").map(String::as_str) != Some("up")
                {
                    return false;
                }
            }
            self.nodes
                .iter()
                .filter(|n| n.child.is_some() && !n.is_paused())
                .all(|n| {
                    let state_ok = n
                        .try_cmd(&["CLUSTER", "INFO"])
                        .ok()
                        .and_then(|r| text(&r))
                        .map(|t| {
                            parse_info(&t).get("cluster_state").map(String::as_str) == Some("ok")
                        })
                        .unwrap_or(false);
                    let view = n
                        .try_cmd(&["CLUSTER", "NODES"])
                        .ok()
                        .and_then(|r| text(&r))
                        .map(|t| parse_cluster_nodes(&t))
                        .unwrap_or_default();
                    let has = |id: &str, flag: &str| {
                        view.iter()
                            .any(|l| l.id == id && l.flags.iter().any(|f| f == flag))
                    };
                    state_ok
                        && has(&my_id, "master")
                        && (old_master.is_none() || has(&old_master_id, "slave"))
                })
        };

        // Redis aborts a manual failover that cannot finish within 5 s;
        // re-issue it (about 3 tries) until the overall deadline.
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            if node.role().as_deref() != Some("master") {
                assert_ok(node.cmd(&["CLUSTER", "FAILOVER"]), "CLUSTER FAILOVER");
            }
            let budget = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(10));
            let mut backoff = Backoff::new(budget);
            loop {
                if done() {
                    return;
                }
                if !backoff.wait() {
                    break;
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "failover of node {node_index} (port {}) did not complete within {SYNC_TIMEOUT:?}\n{}",
                    node.port(),
                    self.describe(&format!("{:?}", self.health_problems()))
                );
            }
        }
    }
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("masters", &self.masters)
            .field("replicas_per_master", &self.replicas_per_master)
            .field("nodes", &self.nodes)
            .finish()
    }
}
