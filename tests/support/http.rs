//! Real HTTP for tests: an axum app served on 127.0.0.1 and a hyper client.
#![allow(dead_code)]

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `/` answers 200 `ok`, `/not-modified` a 304 (a free response).
pub fn app() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/not-modified", get(|| async { StatusCode::NOT_MODIFIED }))
}

/// An axum app listening on a free loopback port; stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Serves `app` with the peer address recorded (`ConnectInfo<SocketAddr>`).
    pub async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        Self {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn header_u64(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("missing header {name}: {:?}", self.headers))
            .parse()
            .unwrap()
    }
}

/// A real HTTP/1.1 client over TCP.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    /// For requests with a body.
    with_body: Client<HttpConnector, Full<Bytes>>,
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    pub fn new() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            with_body: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn get(&self, url: &str) -> Reply {
        self.get_with(url, &[]).await
    }

    /// GET with raw header values (may be non-UTF-8 or long).
    pub async fn get_with(&self, url: &str, headers: &[(&str, &[u8])]) -> Reply {
        let mut req = Request::get(url);
        for (k, v) in headers {
            req = req.header(*k, HeaderValue::from_bytes(v).unwrap());
        }
        let res = self
            .client
            .request(req.body(Empty::new()).unwrap())
            .await
            .unwrap();
        read(res).await
    }

    /// Any method, with `body`.
    pub async fn send(&self, method: Method, url: &str, body: &str) -> Reply {
        self.send_with(method, url, &[], body).await
    }

    /// Any method, with `headers` (a `Host` among them replaces the URL's)
    /// and `body`.
    pub async fn send_with(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let mut req = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
        read(self.with_body.request(req).await.unwrap()).await
    }
}

/// The whole response.
async fn read(res: http::Response<hyper::body::Incoming>) -> Reply {
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}
