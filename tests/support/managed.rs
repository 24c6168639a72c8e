//! Test harness for managed-Redis setups, beside `support/redis.rs`: a CA
//! and certificates made with the `openssl` CLI, TLS servers, a server that
//! listens only on a Unix socket, and `redis-sentinel` processes.
//!
//! Every process runs on 127.0.0.1 (or a socket in its own temp dir), is
//! killed by PID when dropped, and has the Redis harness's watchdog.
#![allow(dead_code)]

use super::redis::{
    cmd_at, connect_with, convert, file_tail, make_temp_dir, missing, pick_free_port, ping_at,
    require_redis, run, spawn_watchdog, tcp, wait_until, RedisServer, Value, CMD_TIMEOUT,
    START_TIMEOUT, SYNC_TIMEOUT,
};
use ::redis::ConnectionAddr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Like `require_redis`, for a test that also runs `tool` (`openssl`,
/// `redis-sentinel`): panics unless Redis and `tool` can be run.
#[track_caller]
pub fn require(tool: &str) {
    require_redis();
    let bin = match tool {
        "redis-sentinel" => sentinel_bin(),
        other => other.to_owned(),
    };
    if let Err(e) = Command::new(&bin)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        missing(&bin, &e.to_string());
    }
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl (scripts/test.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA made for one test, a server certificate it signed for `127.0.0.1`
/// and `localhost`, and a client certificate it signed (for mutual TLS).
/// ECDSA P-256 keys: quick to make.
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// Makes a new CA and both certificates in a temp dir of their own.
    pub fn make() -> Self {
        let dir = make_temp_dir(0);
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec![
            "req",
            "-x509",
            "-days",
            "2",
            "-subj",
            "/CN=tower-ratelimit test CA",
        ];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
        openssl(&ca, &dir);
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let mut req = vec!["req", "-subj"];
            let subject = format!("/CN={name}");
            req.push(&subject);
            req.extend(ec);
            let (key, csr, pem) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
            );
            req.extend(["-keyout", &key, "-out", &csr]);
            openssl(&req, &dir);
            let ext = format!("{name}.ext");
            fs::write(
                dir.join(&ext),
                format!("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n"),
            )
            .unwrap();
            openssl(
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    &ext,
                    "-out",
                    &pem,
                ],
                &dir,
            );
        }
        Certs { dir }
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> Vec<u8> {
        fs::read(self.dir.join("ca.pem")).unwrap()
    }

    /// The client certificate and its key (PEM).
    pub fn client_pem(&self) -> (Vec<u8>, Vec<u8>) {
        (
            fs::read(self.dir.join("client.pem")).unwrap(),
            fs::read(self.dir.join("client.key")).unwrap(),
        )
    }

    /// The TLS settings of a server (or sentinel) listening for TLS on
    /// `tls_port`, asking clients for a certificate when `auth_clients`.
    pub fn server_args(&self, tls_port: u16, auth_clients: bool) -> Vec<String> {
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &self.path("server.pem"),
            "--tls-key-file",
            &self.path("server.key"),
            "--tls-ca-cert-file",
            &self.path("ca.pem"),
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` that speaks TLS on `tls_port()` (and plain TCP on its
/// other port, for the harness's own commands).
pub struct TlsRedis {
    pub server: RedisServer,
    tls_port: u16,
}

impl TlsRedis {
    /// With `extra` config args after the TLS ones.
    pub fn start(certs: &Certs, auth_clients: bool, extra: &[&str]) -> Self {
        let tls_port = pick_free_port();
        let mut args = certs.server_args(tls_port, auth_clients);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        TlsRedis {
            server: RedisServer::start_with(&args),
            tls_port,
        }
    }

    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// `rediss://127.0.0.1:TLS_PORT`
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}

/// A `redis-server` that listens on a Unix socket and on no TCP port.
pub struct UnixRedis {
    child: Child,
    watchdog: Option<Child>,
    dir: PathBuf,
}

impl UnixRedis {
    pub fn start() -> Self {
        // A number of its own in the dir's name: the watchdog finds the
        // process by it (the server has no port).
        let marker = pick_free_port();
        let dir = make_temp_dir(marker);
        let socket = dir.join("redis.sock");
        let child = Command::new(
            std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into()),
        )
        .args(["--port", "0", "--unixsocket"])
        .arg(&socket)
        .args([
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
        let watchdog = spawn_watchdog(child.id(), marker, &dir);
        let server = UnixRedis {
            child,
            watchdog,
            dir,
        };
        wait_until(
            START_TIMEOUT,
            "redis-server on its Unix socket to answer PING",
            || ping_at(ConnectionAddr::Unix(server.socket())).then_some(()),
            || file_tail(&server.dir.join("redis.log"), 20),
        );
        server
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    /// Runs one command on a fresh connection (a Redis error reply is a
    /// `Value::ServerError`).
    #[track_caller]
    pub fn cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Value {
        let addr = ConnectionAddr::Unix(self.socket());
        connect_with(addr, Duration::from_secs(2), CMD_TIMEOUT)
            .and_then(|mut c| run(&mut c, args))
            .unwrap_or_else(|e| panic!("command on {} failed: {e}", self.socket().display()))
    }

    /// Runs one command and converts its reply; panics on any error.
    #[track_caller]
    pub fn query<T: ::redis::FromRedisValue>(&self, args: &[impl AsRef<[u8]>]) -> T {
        convert(self.cmd(args), args)
    }

    /// Keys without a TTL, sorted.
    #[track_caller]
    pub fn keys_without_ttl(&self) -> Vec<String> {
        let mut missing: Vec<String> = self
            .query::<Vec<String>>(&["KEYS", "*"])
            .into_iter()
            .filter(|k| self.query::<i64>(&["PTTL", k]) == -1)
            .collect();
        missing.sort();
        missing
    }
}

impl Drop for UnixRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// How the sentinels reach the primary and its replicas, and how clients
/// reach the sentinels.
#[derive(Default)]
pub struct SentinelOptions<'a> {
    /// The data nodes' ACL user and password, if they need one.
    pub node_auth: Option<(&'a str, &'a str)>,
    /// A user and password the sentinels accept from clients (besides the
    /// open default user the harness uses).
    pub sentinel_auth: Option<(&'a str, &'a str)>,
    /// TLS: the sentinels listen for TLS too, and talk TLS to the data nodes
    /// (whose address they are given is then their TLS port).
    pub tls: Option<&'a Certs>,
}

/// One `redis-sentinel` process on 127.0.0.1.
pub struct Sentinel {
    port: u16,
    tls_port: Option<u16>,
    child: Child,
    watchdog: Option<Child>,
    dir: PathBuf,
}

fn sentinel_bin() -> String {
    std::env::var("REDIS_SENTINEL_BIN").unwrap_or_else(|_| "redis-sentinel".into())
}

/// The master name every sentinel here monitors.
pub const MASTER: &str = "mymaster";

impl Sentinel {
    /// A sentinel monitoring the primary at `127.0.0.1:primary_port`.
    pub fn start(primary_port: u16, opts: &SentinelOptions<'_>) -> Self {
        let port = pick_free_port();
        let dir = make_temp_dir(port);
        let mut conf = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {MASTER} 2000\n\
             sentinel failover-timeout {MASTER} 6000\n\
             sentinel parallel-syncs {MASTER} 1\n\
             user default on nopass ~* &* +@all\n",
            dir = dir.display()
        );
        if let Some((user, pass)) = opts.node_auth {
            conf.push_str(&format!(
                "sentinel auth-user {MASTER} {user}\nsentinel auth-pass {MASTER} {pass}\n"
            ));
        }
        if let Some((user, pass)) = opts.sentinel_auth {
            conf.push_str(&format!("user {user} on >{pass} ~* &* +@all\n"));
        }
        let tls_port = opts.tls.map(|certs| {
            let tls_port = pick_free_port();
            for pair in certs.server_args(tls_port, false).chunks(2) {
                conf.push_str(&format!(
                    "{} {}\n",
                    pair[0].trim_start_matches('-'),
                    pair[1]
                ));
            }
            conf.push_str("tls-replication yes\n");
            tls_port
        });
        let path = dir.join("sentinel.conf");
        fs::write(&path, conf).unwrap();
        let child = Command::new(sentinel_bin())
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} (scripts/test.sh installs redis-sentinel): {e}",
                    sentinel_bin()
                )
            });
        let watchdog = spawn_watchdog(child.id(), port, &dir);
        let sentinel = Sentinel {
            port,
            tls_port,
            child,
            watchdog,
            dir,
        };
        wait_until(
            START_TIMEOUT,
            &format!("redis-sentinel on 127.0.0.1:{port} to answer PING"),
            || ping_at(tcp(sentinel.addr())).then_some(()),
            || sentinel.log(),
        );
        sentinel
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// `redis://[user:pass@]127.0.0.1:PORT`, or `rediss://…` on its TLS port.
    pub fn url(&self, auth: Option<(&str, &str)>) -> String {
        let auth = auth.map_or(String::new(), |(u, p)| format!("{u}:{p}@"));
        match self.tls_port {
            Some(t) => format!("rediss://{auth}127.0.0.1:{t}"),
            None => format!("redis://{auth}127.0.0.1:{}", self.port),
        }
    }

    pub fn log(&self) -> String {
        file_tail(&self.dir.join("sentinel.log"), 30)
    }

    /// Runs one command on a fresh connection (a Redis error reply is a
    /// `Value::ServerError`).
    #[track_caller]
    pub fn cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Value {
        cmd_at(self.addr(), args)
            .unwrap_or_else(|e| panic!("command on sentinel {} failed: {e}", self.addr()))
    }

    /// Runs one command and converts its reply; panics on any error.
    #[track_caller]
    pub fn query<T: ::redis::FromRedisValue>(&self, args: &[impl AsRef<[u8]>]) -> T {
        convert(self.cmd(args), args)
    }

    /// The port of the primary this sentinel names.
    pub fn master_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> =
            ::redis::from_redis_value(self.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]))
                .ok()?;
        Some(addr?.1)
    }

    /// How many replicas of the master this sentinel knows (not down).
    pub fn replicas(&self) -> usize {
        match self.cmd(&["SENTINEL", "REPLICAS", MASTER]) {
            Value::Array(list) => list.len(),
            _ => 0,
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Three sentinels watching one primary, once each knows the replica and
/// the other sentinels.
pub fn sentinels(primary_port: u16, opts: &SentinelOptions<'_>) -> Vec<Sentinel> {
    let all: Vec<Sentinel> = (0..3)
        .map(|_| Sentinel::start(primary_port, opts))
        .collect();
    for s in &all {
        wait_until(
            SYNC_TIMEOUT,
            "each sentinel to know the replica and the other sentinels",
            || {
                let others = match s.cmd(&["SENTINEL", "SENTINELS", MASTER]) {
                    Value::Array(list) => list.len(),
                    _ => 0,
                };
                (s.replicas() >= 1 && others >= 2).then_some(())
            },
            || s.log(),
        );
    }
    all
}

/// Waits until every sentinel names the primary on `port`.
#[track_caller]
pub fn wait_for_master(sentinels: &[Sentinel], port: u16) {
    for s in sentinels {
        wait_until(
            SYNC_TIMEOUT,
            &format!("sentinel {} to name 127.0.0.1:{port} the primary", s.addr()),
            || (s.master_port() == Some(port)).then_some(()),
            || s.log(),
        );
    }
}
