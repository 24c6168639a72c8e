//! How a store reaches one Redis role (its primary, or a replica): a URL
//! (`redis://`, `rediss://`, `unix://`, `redis+unix://`) or, with the
//! `sentinel` feature, the node Sentinel names.
//!
//! The store opens the socket itself, on the runtime of the lane that will
//! use it (TCP without Nagle's delay, a Unix socket, or TLS through rustls:
//! see [`super::tls`]), and redis-rs does the rest on it: the handshake
//! (`HELLO`, `AUTH`, `SELECT`), RESP2 or RESP3, and the multiplexed
//! connection. redis-rs hands back the connection's driver (the future that
//! writes commands and reads replies) instead of spawning it: the lane's
//! runner polls it, so a reply is read by the task that waits for it.

use super::url::Redacted;
use crate::error::ConfigErrorKind;
use crate::error::{ConfigError, StoreError};
use redis::aio::MultiplexedConnection;
use redis::{
    self, io::tcp::TcpSettings, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo,
    IntoConnectionInfo, RedisConnectionInfo, RedisError, RedisResult,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
    /// The TLS client for the connections the store opens itself.
    #[cfg(feature = "tls")]
    fn connector(&self) -> Result<super::tls::Connector, ConfigError> {
        super::tls::Connector::new(self.ca.as_deref(), self.client.as_ref(), self.insecure)
    }

    /// The same settings for the connections redis-rs makes itself (Sentinel, Cluster).
    #[cfg(all(feature = "tls", any(feature = "sentinel", feature = "cluster")))]
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

/// Where a [`Node`]'s connections go.
enum Target {
    Url(Box<ConnectionInfo>),
    #[cfg(feature = "sentinel")]
    Sentinel(std::sync::Arc<tokio::sync::Mutex<redis::sentinel::SentinelClient>>),
}

/// One Redis role and how to connect to it.
pub(crate) struct Node {
    target: Target,
    connect_timeout: Duration,
    /// The URL as it may be shown (no password), or the Sentinel master's name.
    shown: String,
    /// The TLS client for `rediss://` nodes.
    #[cfg(feature = "tls")]
    tls: Option<super::tls::Connector>,
    is_tls: bool,
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

/// A connection's driver: writes what its connection queued and reads the
/// replies into the calls waiting for them. It ends when the connection does.
pub(crate) type Driver = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One open connection: redis-rs's multiplexed connection (clones share its
/// socket and pipeline their commands on it), its driver, and the runtime
/// whose reactor the socket is registered with.
pub(crate) struct Link {
    pub(crate) conn: MultiplexedConnection,
    pub(crate) driver: Driver,
    pub(crate) runtime: tokio::runtime::Id,
    /// Set when bytes are read from the socket.
    heard: Arc<AtomicBool>,
}

impl Link {
    /// Whether anything was read from the socket since the last time asked.
    pub(crate) fn heard(&self) -> bool {
        self.heard.swap(false, Ordering::Relaxed)
    }

    /// Runs `call` (a command on this connection) while polling the
    /// driver, before a lane owns the connection (the eviction check).
    pub(crate) async fn drive<T>(
        &mut self,
        call: impl Future<Output = T>,
    ) -> Result<T, StoreError> {
        let mut call = std::pin::pin!(call);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = call.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            // Writes what the call queued; reads its reply.
            if self.driver.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(StoreError::Unavailable(
                    "redis closed the connection while it was being set up".into(),
                )));
            }
            call.as_mut().poll(cx).map(Ok)
        })
        .await
    }
}

impl Node {
    /// The node at `url`.
    pub(crate) fn from_url(url: &str, settings: &Settings) -> Result<Self, ConfigError> {
        let info = connection_info(url, &settings.tls)?;
        let is_tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        Ok(Node {
            target: Target::Url(Box::new(info)),
            connect_timeout: settings.connect_timeout,
            shown: Redacted(url).to_string(),
            #[cfg(feature = "tls")]
            tls: is_tls.then(|| settings.tls.connector()).transpose()?,
            is_tls,
        })
    }

    /// The node Sentinel names for `client`'s role.
    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(
        client: redis::sentinel::SentinelClient,
        shown: String,
        is_tls: bool,
        settings: &Settings,
    ) -> Result<Self, ConfigError> {
        Ok(Node {
            target: Target::Sentinel(std::sync::Arc::new(tokio::sync::Mutex::new(client))),
            connect_timeout: settings.connect_timeout,
            shown,
            #[cfg(feature = "tls")]
            tls: is_tls.then(|| settings.tls.connector()).transpose()?,
            is_tls,
        })
    }

    /// The node as it may be shown: its URL without the password.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// The time allowed to open a connection.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Opens a new connection on the current runtime (Sentinel's answer, the
    /// TLS handshake and `AUTH` included; the caller bounds the time). A
    /// failure says what failed, naming TLS for a TLS node.
    pub(crate) async fn connect(&self) -> Result<Link, StoreError> {
        let info = match &self.target {
            Target::Url(info) => (**info).clone(),
            #[cfg(feature = "sentinel")]
            Target::Sentinel(sentinel) => self.ask_sentinel(sentinel).await?,
        };
        self.open(&info).await.map_err(|e| self.failure(&e))
    }

    /// A connection to this node that failed for `why`, naming TLS for a TLS node.
    pub(crate) fn failure(&self, why: &dyn std::fmt::Display) -> StoreError {
        let what = if self.is_tls {
            "TLS connection"
        } else {
            "connection"
        };
        StoreError::Unavailable(format!("redis {what} to {} failed: {why}", self.shown))
    }

    /// Where Sentinel says the role is now, asked afresh on every
    /// connection (after a failover the next connection reaches the
    /// promoted node). Asked from the Redis I/O thread, where the
    /// connections to the sentinels live between failovers.
    #[cfg(feature = "sentinel")]
    async fn ask_sentinel(
        &self,
        sentinel: &std::sync::Arc<tokio::sync::Mutex<redis::sentinel::SentinelClient>>,
    ) -> Result<ConnectionInfo, StoreError> {
        let (sentinel, limit) = (sentinel.clone(), self.connect_timeout);
        let asked = super::io::call(async move {
            let ask = async { sentinel.lock().await.async_get_client().await };
            Ok(match tokio::time::timeout(limit, ask).await {
                Ok(Ok(client)) => Ok(client.get_connection_info().clone()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("Sentinel did not answer within {limit:?}")),
            })
        })
        .await?;
        asked.map_err(|why| self.failure(&why))
    }

    /// The socket to `info`'s address, and redis-rs's connection over it.
    async fn open(&self, info: &ConnectionInfo) -> RedisResult<Link> {
        let settings = info.redis_settings();
        match info.addr() {
            ConnectionAddr::Tcp(host, port) => handshake(settings, tcp(host, *port).await?).await,
            ConnectionAddr::TcpTls { host, port, .. } => {
                let socket = tcp(host, *port).await?;
                #[cfg(feature = "tls")]
                if let Some(tls) = &self.tls {
                    return handshake(settings, tls.connect(host, socket).await?).await;
                }
                drop(socket);
                Err(unsupported("a TLS node needs the `tls` feature"))
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                handshake(settings, tokio::net::UnixStream::connect(path).await?).await
            }
            _ => Err(unsupported("this kind of address is not supported here")),
        }
    }
}

fn unsupported(why: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::InvalidClientConfig, why))
}

/// A TCP connection to `host:port` without Nagle's delay.
async fn tcp(host: &str, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpStream::connect((host, port)).await?;
    socket.set_nodelay(tcp_settings().nodelay())?;
    Ok(socket)
}

/// redis-rs's connection over `socket`, its handshake done, and its driver
/// (not spawned). No response timeout: the lane times each call itself.
async fn handshake<S>(settings: &RedisConnectionInfo, socket: S) -> RedisResult<Link>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    let heard = Arc::new(AtomicBool::new(false));
    let socket = Heard {
        socket,
        heard: heard.clone(),
    };
    let (conn, driver) = MultiplexedConnection::new_with_config(settings, socket, config).await?;
    Ok(Link {
        conn,
        driver: Box::pin(driver),
        runtime: tokio::runtime::Handle::current().id(),
        heard,
    })
}

/// A socket that notes when it reads anything: a large reply still coming
/// in shows a server that answers, though no reply is complete yet.
struct Heard<S> {
    socket: S,
    heard: Arc<AtomicBool>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Heard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.socket).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.heard.store(true, Ordering::Relaxed);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Heard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.socket).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.socket).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.socket).poll_shutdown(cx)
    }
}
