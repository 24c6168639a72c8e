//! The demo's admin interface, reached as an operator reaches it: over TCP,
//! with the token the demo printed or was given.
#![allow(dead_code)]

use super::example::Running;
use super::http::{HttpClient, Reply};
use http::Method;
use std::net::SocketAddr;
use std::time::Duration;

/// One demo's admin interface and its token.
pub struct Admin {
    pub addr: SocketAddr,
    pub token: String,
    c: HttpClient,
}

impl Admin {
    /// Reads the demo's `admin listening on ADDR` line and the `admin token
    /// TOKEN` line it prints after it when it made the token itself.
    pub fn printed(demo: &Running) -> Admin {
        let addr = admin_addr(demo);
        let line = next_line(demo, "the admin token line");
        let token = line
            .strip_prefix("admin token ")
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
            .to_owned();
        Admin::at(addr, &token)
    }

    /// Reads the demo's `admin listening on ADDR` line; `token` is the one it
    /// was given (it prints none then).
    pub fn given(demo: &Running, token: &str) -> Admin {
        Admin::at(admin_addr(demo), token)
    }

    pub fn at(addr: SocketAddr, token: &str) -> Admin {
        Admin {
            addr,
            token: token.to_owned(),
            c: HttpClient::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `Authorization: Bearer TOKEN`.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// `method` on `path` with the token.
    pub async fn send(&self, method: Method, path: &str, body: &str) -> Reply {
        let auth = self.bearer();
        self.c
            .send_with(method, &self.url(path), &[("authorization", &auth)], body)
            .await
    }

    /// `GET path` with the token.
    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, "").await
    }
}

fn next_line(demo: &Running, what: &str) -> String {
    demo.stdout_rest
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what}"))
}

fn admin_addr(demo: &Running) -> SocketAddr {
    let line = next_line(demo, "the admin line");
    line.strip_prefix("admin listening on ")
        .unwrap_or_else(|| panic!("unexpected line {line:?}"))
        .parse()
        .unwrap()
}
