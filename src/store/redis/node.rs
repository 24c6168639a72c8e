//! How a store reaches one Redis role (its primary, or a replica): a URL
//! (`redis://`, `rediss://`, `unix://`, `redis+unix://`) or, with the
//! `sentinel` feature, the node Sentinel names. redis-rs does the rest:
//! the socket, TLS, `AUTH`, `SELECT`, RESP2 or RESP3.

use super::url::Redacted;
use crate::error::ConfigErrorKind;
use crate::error::{ConfigError, StoreError};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    self, io::tcp::TcpSettings, AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo,
    IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// What a TLS connection trusts and presents (feature `tls`).
#[derive(Clone, Default)]
pub(crate) struct Tls {
    /// CA certificates (PEM) that replace the system roots.
    #[cfg(feature = "tls")]
    pub(crate) ca: Option<Vec<u8>>,
    /// A client certificate chain and its key (PEM), for mutual TLS.
    #[cfg(feature = "tls")]
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
    /// Accept any server certificate (asked for by name only).
    #[cfg(feature = "tls")]
    pub(crate) insecure: bool,
}

impl Tls {
    /// Whether anything beyond the defaults is configured.
    #[cfg(feature = "tls")]
    fn is_custom(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

/// The settings every connection of a store shares.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) tls: Tls,
}

impl Settings {
    fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
    }
}

/// Where a [`Node`]'s connections go.
enum Target {
    Client(Client),
    #[cfg(feature = "sentinel")]
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

/// One Redis role and how to connect to it.
pub(crate) struct Node {
    target: Target,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// The URL as it may be shown (no password), or the Sentinel master's name.
    shown: String,
    tls: bool,
}

/// The parsed form of `url`, with the TLS settings applied; errors never show the password.
pub(crate) fn connection_info(url: &str, tls: &Tls) -> Result<ConnectionInfo, ConfigError> {
    let info = url
        .into_connection_info()
        .map_err(|e| {
            ConfigError::new(
                ConfigErrorKind::Store,
                format!("invalid redis url {}: {e}", Redacted(url)),
            )
        })?
        .set_tcp_settings(tcp_settings());
    if let ConnectionAddr::TcpTls {
        host,
        port,
        insecure,
        tls_params,
    } = info.addr().clone()
    {
        if insecure {
            return Err(ConfigError::new(
                ConfigErrorKind::Store,
                format!(
                    "redis url {}: `#insecure` turns off certificate verification; call \
                 RedisStoreBuilder::danger_accept_invalid_certificates() instead if that is \
                 really meant",
                    Redacted(url)
                ),
            ));
        }
        #[cfg(feature = "tls")]
        if tls.insecure {
            return Ok(info.set_addr(ConnectionAddr::TcpTls {
                host,
                port,
                insecure: true,
                tls_params,
            }));
        }
        #[cfg(not(feature = "tls"))]
        let _ = (host, port, tls_params);
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    Ok(info)
}

/// Every TCP connection's settings: no Nagle delay. A batch written while
/// another is unacknowledged must leave at once, not wait for an ACK that
/// Redis may delay by 40 ms.
pub(crate) fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A client for `info`, with the custom CA and client certificate, if any.
pub(crate) fn client(info: ConnectionInfo, tls: &Tls, shown: &str) -> Result<Client, ConfigError> {
    let bad =
        |e: RedisError| ConfigError::new(ConfigErrorKind::Store, format!("redis url {shown}: {e}"));
    #[cfg(feature = "tls")]
    if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        install_crypto_provider();
        if tls.is_custom() {
            return Client::build_with_tls(info, tls.certificates()).map_err(bad);
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    Client::open(info).map_err(bad)
}

/// Gives rustls its cryptography (ring) unless the application chose one.
#[cfg(feature = "tls")]
pub(crate) fn install_crypto_provider() {
    // Fails only when a provider is already installed: that one is used.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Node {
    /// The node at `url`.
    pub(crate) fn from_url(url: &str, settings: &Settings) -> Result<Self, ConfigError> {
        let info = connection_info(url, &settings.tls)?;
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        let shown = Redacted(url).to_string();
        Ok(Node {
            target: Target::Client(client(info, &settings.tls, &shown)?),
            config: settings.config(),
            connect_timeout: settings.connect_timeout,
            shown,
            tls,
        })
    }

    /// The node Sentinel names for `client`'s role.
    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(
        client: redis::sentinel::SentinelClient,
        shown: String,
        tls: bool,
        settings: &Settings,
    ) -> Self {
        Node {
            target: Target::Sentinel(tokio::sync::Mutex::new(client)),
            config: settings.config(),
            connect_timeout: settings.connect_timeout,
            shown,
            tls,
        }
    }

    /// The node as it may be shown: its URL without the password.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// Opens a new connection within the connect timeout (Sentinel's
    /// answer, the TLS handshake and `AUTH` included). A failure says what
    /// failed, naming TLS for a TLS node.
    pub(crate) async fn connect(&self) -> Result<Conn, StoreError> {
        let what = if self.tls {
            "TLS connection"
        } else {
            "connection"
        };
        match tokio::time::timeout(self.connect_timeout, self.open()).await {
            Ok(conn) => conn,
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis {what} to {} failed: not made within {:?}",
                self.shown, self.connect_timeout
            ))),
        }
    }

    async fn open(&self) -> Result<Conn, StoreError> {
        let opened = match &self.target {
            Target::Client(c) => {
                c.get_multiplexed_async_connection_with_config(&self.config)
                    .await
            }
            #[cfg(feature = "sentinel")]
            Target::Sentinel(s) => {
                // Sentinel is asked afresh on every connection: after a
                // failover the next connection reaches the promoted node.
                let mut s = s.lock().await;
                s.get_async_connection_with_config(&self.config).await
            }
        };
        let conn = opened.map_err(|e| {
            let what = if self.tls {
                "TLS connection"
            } else {
                "connection"
            };
            StoreError::Unavailable(format!("redis {what} to {} failed: {e}", self.shown))
        })?;
        Ok(Conn {
            conn,
            state: Arc::default(),
        })
    }
}

/// One open connection: redis-rs's multiplexed connection (clones share its
/// socket and pipeline their commands on it), and what is known of its health.
#[derive(Clone)]
pub(crate) struct Conn {
    conn: MultiplexedConnection,
    state: Arc<Health>,
}

#[derive(Default)]
struct Health {
    closed: AtomicBool,
    /// Since when calls on it have timed out with no answer in between.
    stalled_since: Mutex<Option<Instant>>,
}

impl Conn {
    /// Marks the connection broken: whoever asks for one next makes a new one.
    pub(crate) fn close(&self) {
        self.state.closed.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state.closed.load(Ordering::Relaxed)
    }

    /// A call got an answer: the connection works.
    pub(crate) fn answered(&self) {
        let mut since = self
            .state
            .stalled_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if since.is_some() {
            *since = None;
        }
    }

    /// A call timed out: whether nothing has answered on the connection for
    /// `limit` (then it is given up on; a frozen or unreachable server
    /// never closes it itself).
    pub(crate) fn stalled_for(&self, limit: Duration) -> bool {
        let mut since = self
            .state
            .stalled_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        since.get_or_insert_with(Instant::now).elapsed() >= limit
    }

    /// Whether the connection still has its socket, found without a round
    /// trip: a `PING` whose reply is not awaited is handed to the
    /// connection, and that fails at once, before anything is written, when
    /// the connection's task has ended (the server closed the socket while
    /// it was idle).
    pub(crate) async fn is_open(&mut self) -> bool {
        let mut ping = redis::cmd("PING");
        ping.set_no_response(true);
        self.conn.send_packed_command(&ping).await.is_ok()
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.conn.req_packed_command(cmd)
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
