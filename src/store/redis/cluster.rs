//! Redis Cluster: one shared `ClusterConnection` (redis-rs's async cluster
//! client, as re-exported by deadpool-redis), configured so that a script is
//! never run twice.
//!
//! The cluster client multiplexes every call over one connection per node and
//! refreshes its slot map after `MOVED` or a lost node. Its own retry loop is
//! turned off (`retries(0)`): it would also re-send a call after an I/O error
//! or a response timeout, when the charge script may already have run, and so
//! charge a request twice. Instead [`ClusterLane::run`] re-sends a call only
//! after an answer proving that the node ran nothing:
//!
//! * `MOVED` (the slot has another owner, e.g. after a failover): re-sent to
//!   the node named in the error;
//! * `ASK` (the slot is being migrated and the key has left): re-sent to the
//!   target node behind `ASKING`;
//! * `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, a refused connection
//!   or no known node for the slot: re-sent after a short pause.
//!
//! Redis checks the slot, the cluster state and loading before it runs a
//! command, so each of these answers means the script did not run. Every other
//! failure (I/O error, timeout, `OOM`, `BUSY`, …) is returned to the layer,
//! which answers per its failure policy. The whole call, re-sends included,
//! stays within the store timeout.
//!
//! `SCRIPT LOAD` is not replicated, and a routed `SCRIPT LOAD` would go to
//! every node (failing while any node is down). So the `NOSCRIPT` reload of
//! `invoke_async` is sent to the node that answered `NOSCRIPT`: the one serving
//! the key's slot, or the redirect target.

use super::error::redis_error;
use super::eviction::{self, EvictionCheck};
use super::lane::{convert, Request};
use super::node::{self, Settings};
use super::url::Redacted;
use crate::error::ConfigErrorKind;
use crate::error::{ConfigError, StoreError};
use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    self, Arg, Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, ServerErrorKind,
    Value,
};
use std::time::Duration;
use tokio::sync::OnceCell;

/// Attempts per call, redirects included (a failover needs two: `MOVED`, then the new owner).
const ATTEMPTS: u32 = 5;

pub(crate) struct ClusterLane {
    client: ClusterClient,
    conn: OnceCell<ClusterConnection>,
    connect_timeout: Duration,
    eviction: EvictionCheck,
    /// The first seed node, as it may be shown.
    shown: String,
}

impl ClusterLane {
    pub(crate) fn new(
        urls: &[String],
        settings: &Settings,
        eviction: EvictionCheck,
    ) -> Result<Self, ConfigError> {
        let infos = urls
            .iter()
            .map(|u| node::connection_info(u, &settings.tls))
            .collect::<Result<Vec<_>, _>>()?;
        let shown = Redacted(&urls[0]).to_string();
        #[allow(unused_mut)]
        let mut builder = ClusterClientBuilder::new(infos)
            // Never re-send after an I/O error or timeout: see the module docs.
            .retries(0)
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.response_timeout)
            .tcp_settings(node::tcp_settings());
        #[cfg(feature = "tls")]
        if urls.iter().any(|u| u.starts_with("rediss:")) {
            super::tls::install_crypto_provider();
            if settings.tls.insecure {
                builder = builder.tls(redis::TlsMode::Insecure);
            }
            if settings.tls.ca.is_some() || settings.tls.client.is_some() {
                builder = builder.certs(settings.tls.certificates());
            }
        }
        let client = builder.build().map_err(|e| {
            ConfigError::new(
                ConfigErrorKind::Store,
                format!("invalid redis cluster urls ({shown}, ...): {e}"),
            )
        })?;
        Ok(Self {
            client,
            conn: OnceCell::new(),
            connect_timeout: settings.connect_timeout,
            eviction,
            shown,
        })
    }

    /// The shared connection, connecting (and checking eviction) on first
    /// use; a failed attempt is retried by the next call.
    async fn connection(&self) -> Result<ClusterConnection, StoreError> {
        self.conn
            .get_or_try_init(|| async {
                let mut conn = match tokio::time::timeout(
                    self.connect_timeout,
                    self.client.get_async_connection(),
                )
                .await
                {
                    Ok(conn) => conn.map_err(redis_error)?,
                    Err(_) => {
                        return Err(StoreError::Unavailable(format!(
                            "redis cluster {}: no connection within {:?}",
                            self.shown, self.connect_timeout
                        )))
                    }
                };
                eviction::check_eviction(self.eviction, &mut conn, &self.shown).await?;
                Ok(conn)
            })
            .await
            .cloned()
    }

    /// Opens the shared connection (within the connect timeout).
    pub(crate) async fn connect(&self) -> Result<(), StoreError> {
        self.connection().await.map(drop)
    }

    /// Runs `call` within `budget`, re-sending it only after answers that
    /// prove nothing ran.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        request: &Request,
        budget: Duration,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(budget, self.run_unbounded(request)).await {
            Ok(r) => convert(r?),
            Err(_) => Err(StoreError::Timeout(budget)),
        }
    }

    #[cfg(feature = "coordinated")]
    /// Sends single-key commands, all at once, each to the node serving
    /// its key and each within `budget`; the answer to each, in order. The
    /// client multiplexes the commands bound for one node on its connection
    /// to it, so they travel together. Sent one by one rather than as a
    /// redis-rs pipeline, an error (a `MOVED` while a slot migrates, a node
    /// that is down) fails only its own command. Nothing is re-sent: the
    /// caller counts a failed command as not run.
    pub(crate) async fn spread(
        &self,
        cmds: &[Cmd],
        budget: Duration,
    ) -> Vec<Result<Value, StoreError>> {
        // Connecting gets the connect timeout (it bounds itself): a first
        // connection cut short by a sync's budget would start over each sync.
        let conn = match self.connection().await {
            Ok(conn) => conn,
            Err(e) => return super::failed_all(cmds.len(), e),
        };
        let sends = cmds.iter().map(|cmd| {
            let mut conn = conn.clone();
            async move {
                match tokio::time::timeout(budget, conn.req_packed_command(cmd)).await {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(e)) => Err(redis_error(e)),
                    Err(_) => Err(StoreError::Timeout(budget)),
                }
            }
        });
        futures_util::future::join_all(sends).await
    }

    async fn run_unbounded(&self, request: &Request) -> Result<Value, StoreError> {
        let mut target = Target {
            conn: self.connection().await?,
            slot: None,
            redirect: None,
        };
        let mut attempt = 0;
        loop {
            let err = match request.send(&mut target).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            attempt += 1;
            match resend(&err) {
                Some(next) if attempt < ATTEMPTS => match next {
                    Resend::To(redirect) => target.redirect = Some(redirect),
                    Resend::Later => {
                        target.redirect = None;
                        // 2, 4, 8, 16 ms: time for the client to refresh its slots.
                        tokio::time::sleep(Duration::from_millis(1 << attempt)).await;
                    }
                },
                _ => return Err(redis_error(err)),
            }
        }
    }
}

/// How to re-send a call that ran nothing.
#[derive(Debug, PartialEq, Eq)]
enum Resend {
    /// To this node now.
    To(Redirect),
    /// By slot, after a pause.
    Later,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Redirect {
    host: String,
    port: u16,
    /// `ASK`: the node serves the key only after `ASKING`.
    asking: bool,
}

/// Whether `err` proves the call did not run, and how to re-send it.
fn resend(err: &RedisError) -> Option<Resend> {
    match err.kind() {
        ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask)) => {
            let (addr, _slot) = err.redirect_node()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some(Resend::To(Redirect {
                host: host.to_owned(),
                port: port.parse().ok()?,
                asking: kind == ServerErrorKind::Ask,
            }))
        }
        ErrorKind::Server(
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading,
        )
        | ErrorKind::ClusterConnectionNotFound => Some(Resend::Later),
        // Refused at connect time: nothing was sent.
        _ if err.is_connection_refusal() => Some(Resend::Later),
        _ => None,
    }
}

/// The cluster connection, aimed at one node for every command of a call:
/// the script and, after `NOSCRIPT`, its `SCRIPT LOAD` go to the same node.
struct Target {
    conn: ClusterConnection,
    /// The node serving the script's key (known once the script was sent).
    slot: Option<Route>,
    redirect: Option<Redirect>,
}

impl Target {
    fn routing(&mut self, cmd: &Cmd) -> Option<SingleNodeRoutingInfo> {
        if let Some(r) = &self.redirect {
            return Some(SingleNodeRoutingInfo::ByAddress {
                host: r.host.clone(),
                port: r.port,
            });
        }
        if self.slot.is_none() {
            self.slot = script_key(cmd).map(|key| Route::with_key(key, SlotAddr::Master));
        }
        self.slot.map(SingleNodeRoutingInfo::SpecificNode)
    }
}

/// The first key of an `EVALSHA`/`EVAL` (`EVALSHA sha numkeys key …`).
fn script_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|a| match a {
        Arg::Simple(b) => b,
        _ => &[][..],
    });
    let name = args.next()?;
    if !(name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL")) {
        return None;
    }
    let _script = args.next()?;
    let keys = args.next()?;
    (keys != b"0").then(|| args.next()).flatten()
}

impl ConnectionLike for Target {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let routing = self.routing(cmd);
        let asking = self.redirect.as_ref().is_some_and(|r| r.asking);
        let mut conn = self.conn.clone();
        Box::pin(async move {
            match (routing, asking) {
                (Some(route), true) => {
                    let mut pipe = redis::pipe();
                    pipe.cmd("ASKING").add_command(cmd.clone());
                    let mut replies = conn.route_pipeline(pipe, 1, 1, route).await?;
                    replies.pop().ok_or_else(|| {
                        RedisError::from((ErrorKind::Client, "no reply after ASKING"))
                    })
                }
                (Some(route), false) => {
                    conn.route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                        .await
                }
                // Not a script (e.g. HMGET): the client routes it by its key.
                (None, _) => conn.req_packed_command(cmd).await,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(text: &str) -> RedisError {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn only_answers_that_prove_nothing_ran_are_re_sent() {
        assert_eq!(
            resend(&server_error("MOVED 3999 127.0.0.1:6381")),
            Some(Resend::To(Redirect {
                host: "127.0.0.1".into(),
                port: 6381,
                asking: false
            }))
        );
        assert_eq!(
            resend(&server_error("ASK 3999 127.0.0.1:6382")),
            Some(Resend::To(Redirect {
                host: "127.0.0.1".into(),
                port: 6382,
                asking: true
            }))
        );
        for later in [
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down",
            "LOADING Redis is loading the dataset in memory",
        ] {
            assert_eq!(resend(&server_error(later)), Some(Resend::Later), "{later}");
        }
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(resend(&refused), Some(Resend::Later));
        // The script may have run: never re-sent (a second run would charge twice).
        for ran in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            assert_eq!(
                resend(&RedisError::from(std::io::Error::from(ran))),
                None,
                "{ran:?}"
            );
        }
        for err in [
            "OOM command not allowed",
            "BUSY Redis is busy running a script",
            "READONLY You can't write against a read only replica.",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "ERR user_script:1: oops",
        ] {
            assert_eq!(resend(&server_error(err)), None, "{err}");
        }
    }

    #[test]
    fn the_script_key_routes_the_script_and_its_reload() {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("abc").arg(1).arg("trl:x:{tag}").arg("now");
        assert_eq!(script_key(&cmd), Some(&b"trl:x:{tag}"[..]));
        let mut cmd = redis::cmd("EVAL");
        cmd.arg("return 1").arg(0);
        assert_eq!(script_key(&cmd), None);
        assert_eq!(script_key(redis::cmd("SCRIPT").arg("LOAD").arg("x")), None);
    }
}
